"""The job side: which config version and node order a job gets (pinned), launchers, the job's own A/B."""
