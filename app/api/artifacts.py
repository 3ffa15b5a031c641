"""Routes of a job's artifacts: list and download (Range requests honoured)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import FileResponse

from app import jobs as service
from app.api.jobs import owned_job
from app.config import get_settings
from app.deps import CurrentUser, SessionDep
from app.schemas import ArtifactInfo

router = APIRouter(prefix="/jobs/{job_id}/artifacts", tags=["artifacts"])


@router.get("", response_model=list[ArtifactInfo])
def list_artifacts(job_id: str, request: Request, session: SessionDep, user: CurrentUser) -> list[ArtifactInfo]:
    """The job's files with their size in bytes, sha256 and download URL."""
    job = owned_job(session, user, job_id)
    base = str(request.base_url).rstrip("/")
    return [ArtifactInfo(**service.artifact_dict(a, f"{base}/jobs/{job.id}/artifacts/{a.name}")) for a in job.artifacts]


@router.api_route("/{name}", methods=["GET", "HEAD"], response_class=FileResponse)
def download_artifact(job_id: str, name: str, session: SessionDep, user: CurrentUser) -> FileResponse:
    """The file itself. Only names the job recorded are served; a name never becomes a path."""
    job = owned_job(session, user, job_id)
    artifact = next((a for a in job.artifacts if a.name == name), None)
    root = get_settings().resolved_artifact_dir()
    path = Path(artifact.path).resolve() if artifact else None
    if path is None or not path.is_relative_to(root) or not path.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} has no artifact named {name!r}")
    return FileResponse(path, filename=artifact.name, media_type="application/octet-stream")
