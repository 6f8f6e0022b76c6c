"""dtype"""
