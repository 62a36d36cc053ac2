"""A study's request as JSON (``StudyRequest``) instead of a serialised admin API ``StartStudyRequest``.

Existing studies are converted field by field, so starting one again with the same settings still resumes
it; downgrading serialises the message again.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from topo_tune.v1 import admin_pb2

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_SCALARS = (
    "study_id",
    "budget",
    "sampler",
    "seed",
    "min_bytes",
    "max_bytes",
    "step_factor",
    "finalists",
    "proof_pairs",
    "no_tuner_table",
)

studies = sa.table(
    "tuning_studies", sa.column("id", sa.String), sa.column("request", sa.LargeBinary), sa.column("settings", sa.JSON)
)


def _as_json(request: admin_pb2.StartStudyRequest) -> dict[str, Any]:
    data: dict[str, Any] = {name: getattr(request, name) for name in _SCALARS}
    data["nodes"] = list(request.nodes)
    data["collectives"] = dict(request.collectives)
    data["site_fixed"] = dict(request.site_fixed)
    data["knobs"] = list(request.knobs)
    data["cuda_graph"] = request.cuda_graph if request.HasField("cuda_graph") else None
    return data


def _as_message(data: dict[str, Any]) -> admin_pb2.StartStudyRequest:
    request = admin_pb2.StartStudyRequest(
        **{name: data[name] for name in _SCALARS},
        nodes=data["nodes"],
        collectives=data["collectives"],
        site_fixed=data["site_fixed"],
        knobs=data["knobs"],
    )
    if data["cuda_graph"] is not None:
        request.cuda_graph = data["cuda_graph"]
    return request


def upgrade() -> None:
    with op.batch_alter_table("tuning_studies", schema=None) as batch_op:
        batch_op.add_column(sa.Column("settings", sa.JSON(), nullable=True))
    connection = op.get_bind()
    for study_id, request in connection.execute(sa.select(studies.c.id, studies.c.request)).all():
        settings = _as_json(admin_pb2.StartStudyRequest.FromString(request))
        connection.execute(sa.update(studies).where(studies.c.id == study_id).values(settings=settings))
    with op.batch_alter_table("tuning_studies", schema=None) as batch_op:
        batch_op.drop_column("request")
    with op.batch_alter_table("tuning_studies", schema=None) as batch_op:
        batch_op.alter_column("settings", new_column_name="request", existing_type=sa.JSON(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("tuning_studies", schema=None) as batch_op:
        batch_op.alter_column("request", new_column_name="settings", existing_type=sa.JSON(), nullable=True)
    with op.batch_alter_table("tuning_studies", schema=None) as batch_op:
        batch_op.add_column(sa.Column("request", sa.LargeBinary(), nullable=True))
    connection = op.get_bind()
    for study_id, settings in connection.execute(sa.select(studies.c.id, studies.c.settings)).all():
        request = _as_message(settings).SerializeToString(deterministic=True)
        connection.execute(sa.update(studies).where(studies.c.id == study_id).values(request=request))
    with op.batch_alter_table("tuning_studies", schema=None) as batch_op:
        batch_op.drop_column("settings")
    with op.batch_alter_table("tuning_studies", schema=None) as batch_op:
        batch_op.alter_column("request", existing_type=sa.LargeBinary(), nullable=False)
