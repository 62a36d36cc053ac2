"""Config versions kept by the controller: stored once by content, listed, shown, diffed, exported."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.support.processes import TOKEN
from topo_tune.cli.main import cli
from topo_tune.client.admin import AdminClient
from topo_tune.controller.server import Controller
from topo_tune.errors import NotFoundError, ValidationError
from topo_tune.versions.version import ConfigVersion


async def admin_cli(controller: Controller, *args: str) -> Result:
    return await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["admin", *args, "--controller", f"127.0.0.1:{controller.port}"],
        env={"TOPO_TUNE_TOKEN": TOKEN},
        prog_name="topo-tune",
    )


async def test_versions_are_stored_by_content(controller: Controller, tmp_path: Path) -> None:
    old = ConfigVersion(
        {"nccl.conf": "NCCL_MIN_CTAS=16\nNCCL_MAX_CTAS=16\n"}, {"study": "s1", "nccl_version": "2.28.9"}
    )
    new = ConfigVersion(
        {"nccl.conf": "NCCL_MIN_CTAS=32\nNCCL_MAX_CTAS=32\n"}, {"study": "s2", "nccl_version": "2.28.9"}
    )

    def put_and_check() -> None:
        with AdminClient(f"127.0.0.1:{controller.port}", token=TOKEN) as client:
            stored = client.put_config_version(dict(old.files), dict(old.provenance), version_id=old.id)
            assert stored.id == old.id
            again = client.put_config_version(dict(old.files), {"study": "another"})
            assert again.id == old.id and again.provenance["study"] == "s1", "a version never changes"
            client.put_config_version(dict(new.files), dict(new.provenance))
            with pytest.raises(ValidationError, match="id: cv-0000000000000000 is not the hash"):
                client.put_config_version(dict(new.files), {}, version_id="cv-0000000000000000")
            with pytest.raises(ValidationError, match="not a config file name"):
                client.put_config_version({"../etc/passwd": "x"}, {})
            with pytest.raises(NotFoundError):
                client.get_config_version("cv-ffffffffffffffff")
            assert [v.id for v in client.list_config_versions()] == [new.id, old.id]

    await asyncio.to_thread(put_and_check)
    listed = await admin_cli(controller, "config", "list")
    assert listed.exit_code == 0 and old.id in listed.stdout and new.id in listed.stdout
    diff = await admin_cli(controller, "config", "diff", old.id, new.id)
    assert "-NCCL_MIN_CTAS=16" in diff.stdout and "+NCCL_MIN_CTAS=32" in diff.stdout
    exported = await admin_cli(controller, "config", "export", new.id, "--dir", str(tmp_path / "cfg"))
    assert exported.exit_code == 0, exported.output
    assert (tmp_path / "cfg" / "nccl.conf").read_text() == new.files["nccl.conf"]
    shown = await admin_cli(controller, "config", "show", old.id)
    assert "NCCL_MIN_CTAS=16" in shown.stdout and "s1" in shown.stdout
