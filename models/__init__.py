"""wattcast.models"""
