"""Routing policies: filters, scorers, pickers and whole routers, built through the registry."""
