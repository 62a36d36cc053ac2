"""Clients of the controller's admin API: the one admin client, which converts the admin API's messages to domain
values at its edge, with its error mapping back to the exception tree."""
