"""The controller's gRPC edge: the admin and agent servicers, request validation, the status code table and
the converters between domain objects and admin API messages. The only controller code that speaks
``admin_pb2``; the services below take and return their own frozen dataclasses."""
