"""Great Expectations gates on raw logs and on the curated dataset."""
