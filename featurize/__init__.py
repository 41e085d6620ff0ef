"""wattcast.featurize"""
