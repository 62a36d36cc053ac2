"""A job's own A/B: ``topo-tune exec --compare`` runs the job's command under two arms and measures the gain.

Pure parts, one concept each: ``schedule`` (which arm each run uses, derived from the job id alone, so every
node runs the same arm at the same time without talking to the others), ``metric`` (the figure read from a
run's output) and ``summary`` (the tuner's proof statistics over the paired runs). Non-goals: running the
command and talking to the controller (the CLI does both).
"""
