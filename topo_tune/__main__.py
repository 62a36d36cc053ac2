"""``python -m topo_tune`` is the ``topo-tune`` command."""

from topo_tune.cli.main import main

main()
