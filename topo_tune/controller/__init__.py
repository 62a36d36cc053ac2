"""The controller: gRPC services for agents and admins, node registry, commands, persistence, schedules."""
