"""wattcast.data"""
