"""wattcast.training"""
