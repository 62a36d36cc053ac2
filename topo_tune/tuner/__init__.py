"""The tuner: search spaces, studies, statistics and the ring-order optimizer. Imports no gRPC."""
