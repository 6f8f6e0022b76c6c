"""forward"""
