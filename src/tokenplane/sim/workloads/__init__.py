"""Workload sources: public trace readers, synthetic arrival processes, agentic users."""
