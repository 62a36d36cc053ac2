"""Config versions: content-addressed files, where agents stage them, and the ring their rank map holds."""
