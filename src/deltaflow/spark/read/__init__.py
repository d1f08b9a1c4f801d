"""Batch reads of Delta tables: the Python data source reader, scan reports, the CDF."""
