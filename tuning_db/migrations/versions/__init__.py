"""The revisions, oldest first: 0001 (the first schema), 0002 (record origin, MySQL LONGTEXT)."""
