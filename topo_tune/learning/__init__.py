"""Production jobs teach the tuner: which arm a job runs, which challenger tables a version may carry, and
what the jobs' timing records show.

A config version may carry challenger per-size tables beside its chosen one (``candidates``: only those the
proof showed non-inferior in every bucket they change); a job runs one arm for its whole life, chosen from
values identical on every rank (``assignment``); the tuner plugin's profiler times the calls, and
``evidence`` compares its records. ``docs/learning.md`` gives the design and its safety argument.
Non-goals here: timing (the plugin does), storing pins (the controller does), proposing versions (not built
yet). The modules are imported by name: ``assignment`` stays free of the tuner's imports, so a job launcher
can use it cheaply.
"""
