"""Clients of the controller's admin API: the one admin client, with its error mapping back to the exception tree."""
