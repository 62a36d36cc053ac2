"""Each launcher's own options, as an allow-list: which take values, so its arguments can be told from the program's.

``exec --launcher`` must see every option the launcher is given, up to the program it runs: an option it sets
itself (``-H``, ``--distribution``, ``--node_rank``) hiding behind a multi-word one (``--mca KEY VALUE``,
``-x NAME``, ``-w LIST``) would give the job the launcher's order after all. So each launcher's options come
from its own list (the ``--help`` of the versions named below) with how many words each takes; an option
not in it is refused by name rather than guessed at, and so is an abbreviation (getopt and argparse accept
unambiguous prefixes, which would slip past a refusal). The program starts at the first word that is neither
an option nor an option's value, or after ``--``.

Non-goals: checking the options' values (the launcher does) and knowing which options conflict with the job's
order (``topo_tune.jobs.launchers``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from topo_tune.errors import ConfigError

Syntax = Literal["getopt", "argparse", "opal"]
"""How values attach: getopt (srun) and argparse (torchrun) take ``--name=value`` and ``-nVALUE`` as well as
separate words; Open MPI's parser (opal) takes separate words only (``--np=2`` is an error there)."""


@dataclass(frozen=True)
class OptionTable:
    """One launcher's options: how many words each takes after it (0: a flag)."""

    launcher: str
    source: str
    """Where the list comes from (the launcher's version and command), named in refusals."""
    words: Mapping[str, int]
    syntax: Syntax
    optional: frozenset[str] = frozenset()
    """Options whose value is optional: it comes only attached (``--exclusive=user``), never as the next word."""


@dataclass(frozen=True)
class LauncherOption:
    """One option as given: its name (as typed, without ``=value``) and its values."""

    name: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class LauncherArgs:
    """A launcher's arguments split: its options in order, and where the program starts (len(args): none)."""

    options: tuple[LauncherOption, ...]
    program_at: int

    def first(self, names: Sequence[str]) -> LauncherOption | None:
        return next((option for option in self.options if option.name in names), None)


def _names(spec: str, words: int) -> dict[str, int]:
    return dict.fromkeys(spec.split(), words)


OPEN_MPI = OptionTable(
    launcher="mpirun",
    source="Open MPI 4.1 mpirun --help all",
    syntax="opal",
    words={
        **_names(
            "-am --app --bind-to -c -np --np -cf --cartofile -cpu-list --cpu-list -cpu-set --cpu-set "
            "-cpus-per-proc --cpus-per-proc -cpus-per-rank --cpus-per-rank -debugger --debugger -default-hostfile "
            "--default-hostfile -H -host --host -hnp --hnp -hostfile --hostfile -launch-agent --launch-agent "
            "-machinefile --machinefile --map-by -max-restarts --max-restarts -max-vm-size --max-vm-size -N -n --n "
            "-npernode --npernode -npersocket --npersocket -ompi-server --ompi-server -output-filename "
            "--output-filename -path --path -personality --personality --ppr --prefix --preload-files --rank-by "
            "-report-events --report-events -report-pid --report-pid -report-uri --report-uri -rf --rankfile "
            "-stdin --stdin -timeout --timeout -tune -wd --wd -wdir --wdir -x -xml-file --xml-file -xterm --xterm",
            1,
        ),
        **_names("-mca --mca -gmca --gmca", 2),
        **_names(
            "-allow-run-as-root --allow-run-as-root -bind-to-core --bind-to-core -bind-to-socket --bind-to-socket "
            "-bycore --bycore -bynode --bynode -byslot --byslot -continuous --continuous -d -debug-devel "
            "--debug-devel -debug --debug -debug-daemons --debug-daemons -debug-daemons-file --debug-daemons-file "
            "-disable-recovery --disable-recovery -display-allocation --display-allocation "
            "-display-devel-allocation --display-devel-allocation -display-devel-map --display-devel-map "
            "-display-diffable-map --display-diffable-map -display-map --display-map -display-topo --display-topo "
            "-do-not-launch --do-not-launch -do-not-resolve --do-not-resolve -dvm --dvm "
            "-enable-instant-on-support --enable-instant-on-support -enable-recovery --enable-recovery "
            "-fwd-mpirun-port --fwd-mpirun-port -get-stack-traces --get-stack-traces -index-argv-by-rank "
            "--index-argv-by-rank -leave-session-attached --leave-session-attached -merge-stderr-to-stdout "
            "--merge-stderr-to-stdout -nolocal --nolocal -nooversubscribe --nooversubscribe --noprefix -novm "
            "--novm -output-proctable --output-proctable -oversubscribe --oversubscribe -pernode --pernode -q "
            "--quiet -report-bindings --report-bindings -report-child-jobs-separately "
            "--report-child-jobs-separately -report-state-on-timeout --report-state-on-timeout -s "
            "--preload-binary -set-cwd-to-session-dir --set-cwd-to-session-dir -show-progress --show-progress "
            "-tag-output --tag-output -timestamp-output --timestamp-output -tv --tv -use-hwthread-cpus "
            "--use-hwthread-cpus -use-regexp --use-regexp -v --verbose -V --version -xml --xml",
            0,
        ),
    },
)

SRUN = OptionTable(
    launcher="srun",
    source="Slurm 22.05 srun --help and srun(1)",
    syntax="getopt",
    words={
        **_names(
            "-A --account --acctg-freq --bb --bbf --bcast-exclude -b --begin -c --cpus-per-task --comment "
            "--container --cpu-freq -d --dependency --deadline --delay-boot -D --chdir --export -e --error --epilog "
            "--gres --gres-flags -i --input --jobid -J --job-name -L --licenses -M --clusters -m --distribution "
            "--mail-type --mail-user --mcs-label --mpi -n --ntasks --ntasks-per-node -N --nodes -o --output "
            "--het-group -p --partition --power --priority --prolog --profile -q --qos -r --relative -S "
            "--core-spec --signal --slurmd-debug --switches --task-epilog --task-prolog --thread-spec -T --threads "
            "-t --time --time-min -W --wait --wckey --cluster-constraint -C --constraint --mem --mincpus "
            "--reservation --tmp -w --nodelist -x --exclude --mem-per-cpu --sockets-per-node --cores-per-socket "
            "--threads-per-core -B --extra-node-info --ntasks-per-core --ntasks-per-socket --cpus-per-gpu -G "
            "--gpus --gpu-bind --gpu-freq --gpus-per-node --gpus-per-socket --gpus-per-task --mem-per-gpu "
            "--cpu-bind --mem-bind --hint --accel-bind --network --ntasks-per-gpu --tres-per-task --uid --gid",
            1,
        ),
        **_names(
            "--bcast --compress -E --preserve-env -H --hold -I --immediate -k --no-kill -K --kill-on-bad-exit -l "
            "--label --multi-prog --nice -O --overcommit --overlap --propagate --pty --quit-on-interrupt -Q --quiet "
            "--reboot -s --oversubscribe --send-libs --spread-job -u --unbuffered --use-min-nodes -v --verbose "
            "-X --disable-status --contiguous -Z --no-allocate --exact --exclusive --resv-ports --test-only --x11 "
            "--kill-command -h --help --usage -V --version",
            0,
        ),
    },
    optional=frozenset(
        {"--bcast", "--compress", "-I", "--immediate", "--nice", "--propagate", "--send-libs", "--exclusive"}
        | {"--x11", "--kill-command"}
    ),
)

TORCHRUN = OptionTable(
    launcher="torchrun",
    source="PyTorch 2.x torchrun --help",
    syntax="argparse",
    words={
        **_names(
            "--nnodes --nproc-per-node --nproc_per_node --rdzv-backend --rdzv_backend --rdzv-endpoint "
            "--rdzv_endpoint --rdzv-id --rdzv_id --rdzv-conf --rdzv_conf --max-restarts --max_restarts "
            "--monitor-interval --monitor_interval --start-method --start_method --event-log-handler "
            "--event_log_handler --role --log-dir --log_dir -r --redirects -t --tee --local-ranks-filter "
            "--local_ranks_filter --duplicate-stdout-filters --duplicate_stdout_filters --duplicate-stderr-filters "
            "--duplicate_stderr_filters --node-rank --node_rank --master-addr --master_addr --master-port "
            "--master_port --local-addr --local_addr --logs-specs --logs_specs --numa-binding --numa_binding "
            "--signals-to-handle --signals_to_handle --shutdown-timeout --shutdown_timeout",
            1,
        ),
        **_names(
            "-h --help --standalone -m --module --no-python --no_python --run-path --run_path "
            "--virtual-local-rank --virtual_local_rank",
            0,
        ),
    },
)


def split_args(args: Sequence[str], table: OptionTable) -> LauncherArgs:
    """``args`` (what follows the launcher's name) as its options and the program's start; an option not in
    ``table`` raises `ConfigError` naming it."""
    options: list[LauncherOption] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            return LauncherArgs(options=tuple(options), program_at=index + 1)
        if not arg.startswith("-") or arg == "-":
            return LauncherArgs(options=tuple(options), program_at=index)
        taken, parsed = _option(args, index, table)
        options.extend(parsed)
        index += taken
    return LauncherArgs(options=tuple(options), program_at=len(args))


def _option(args: Sequence[str], index: int, table: OptionTable) -> tuple[int, list[LauncherOption]]:
    """The option(s) at ``args[index]`` and how many words they take."""
    arg = args[index]
    if arg in table.words:
        count = 0 if arg in table.optional else table.words[arg]
        values = tuple(args[index + 1 : index + 1 + count])
        if len(values) < count:
            raise ConfigError(arg, f"{table.launcher} takes {count} value(s) after it; the command ends first")
        return 1 + count, [LauncherOption(arg, values)]
    name, equals, value = arg.partition("=")
    if table.syntax != "opal" and equals and name.startswith("--") and name in table.words:
        if table.words[name] == 0 and name not in table.optional:
            raise ConfigError(name, f"{table.launcher}'s {name} takes no value")
        return 1, [LauncherOption(name, (value,))]
    if table.syntax == "opal" and equals and name in table.words:
        raise ConfigError(name, f"{table.launcher} takes {name} VALUE as separate words, not {name}=VALUE")
    if table.syntax != "opal" and not arg.startswith("--") and len(arg) > 2:
        return 1, _short_cluster(arg, table)
    raise ConfigError(
        name,
        f"not a {table.launcher} option topo-tune knows ({table.source}; abbreviations are not taken): "
        "spell it out, or put the program after --",
    )


def _short_cluster(arg: str, table: OptionTable) -> list[LauncherOption]:
    """getopt/argparse short options run together: ``-lK`` (flags), ``-n4``/``-wgpu01`` (an attached value)."""
    options: list[LauncherOption] = []
    for at in range(1, len(arg)):
        name = f"-{arg[at]}"
        if name not in table.words:
            raise ConfigError(name, f"not a {table.launcher} option topo-tune knows ({table.source}) in {arg!r}")
        if table.words[name] or name in table.optional:
            return [*options, LauncherOption(name, (arg[at + 1 :],))]
        options.append(LauncherOption(name, ()))
    return options
