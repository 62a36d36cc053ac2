"""cluster.yaml: its schema (pydantic, the settings themselves), value types, checks and the bounded YAML reader."""
