"""One pass of `topo-tune init`: the run itself, what it needs of a controller (the port) and that port over
the admin client, how it evaluates trials as benchmark jobs, and a node as it reads one."""
