"""interactive"""
