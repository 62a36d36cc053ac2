"""Plain values and benchmark messages both daemons put on the wire the same way (domain <-> protobuf)."""
