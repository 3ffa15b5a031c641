"""A sweep's spec checked against the job spec it searches: every dotted path names a field,
every value of every dimension (a range's ends, each listed value) makes a job the server would
accept (the JobSpec's rules and this server's limits), the grid fits the trials, and the
objective is a metric the dataset's task records. Errors are FastAPI's 422 items, each at the
field of the sweep it is about (`["body", "space", "optimizer.lr"]`), naming the fix.
"""

from __future__ import annotations

import copy
import difflib
import types
import typing
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session

from app import limits
from app.code import records as code_records
from app.config import get_settings
from app.datasets import records
from app.keys import Caller
from app.sweeps.spec import SweepSpec
from trainers.spec import PRIORITIES, JobSpec, data_shape

# Fields a sweep sets itself, or that make trials of different data: not searchable.
FIXED = {
    "framework": "use the sweep's frameworks",
    "dataset.id": "a sweep trains on one dataset",
    "dataset.name": "a sweep trains on one dataset",
    "dataset.info": "set by the server",
    "priority": "every trial takes base.priority",
    "webhook_url": "trials send no webhooks of their own (the key's default webhook gets their changes)",
}
REGRESSION_ONLY = ("test_rmse", "test_mae", "test_r2")
CLASSIFICATION_ONLY = ("train_accuracy", "test_accuracy")


class UnknownPath(ValueError):
    """A dotted path that goes through a value that is not an object or a list."""


def set_path(spec: dict[str, Any], path: str, value: Any) -> None:
    """Set `spec[a][b][c] = value` for the path `a.b.c`, creating objects on the way; a number
    segment indexes a list (`model.layers.0.units`). Raises UnknownPath."""
    *parents, last = path.split(".")
    node: Any = spec
    for part in parents:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise UnknownPath(path)
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        node[int(last)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise UnknownPath(path)


def trial_spec(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The base spec with each path of `params` set to its value (a new dict)."""
    spec = copy.deepcopy(base)
    for path, value in params.items():
        set_path(spec, path, value)
    return spec


def known_paths(model: type[BaseModel] = JobSpec, prefix: str = "") -> list[str]:
    """Every dotted path of a job spec's fields (objects followed, lists not)."""
    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        for inner in _models_in(field.annotation):
            paths.extend(known_paths(inner, f"{path}."))
    return paths


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def _error(loc: list[str], message: str, kind: str = "value_error") -> dict:
    return {"type": kind, "loc": ["body", *loc], "msg": message}


def _first_problem(exc: ValidationError | limits.SpecOverLimit) -> str:
    if isinstance(exc, limits.SpecOverLimit):
        return str(exc.errors[0]["msg"])
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


def _check_job(spec: dict[str, Any]) -> JobSpec:
    """The job spec a trial would run; ValidationError or SpecOverLimit as POST /jobs gives."""
    job = JobSpec.model_validate(spec)
    limits.check_spec(job)
    return job


def resolve_base(session: Session, owner: Caller, sweep: SweepSpec) -> dict[str, Any]:
    """The sweep's base job spec, validated (its dataset's record filled in) and normalised, as a
    dict every trial's spec starts from. Raises RequestValidationError naming `base`'s field."""
    base = dict(sweep.base)
    cap = owner.max_priority
    if cap is not None and "priority" not in base and PRIORITIES.index(cap) < PRIORITIES.index("normal"):
        base["priority"] = cap  # a capped key's trials take its cap (limits.capped_priority)
    if base.get("webhook_url") is not None:  # a sweep's many trials would each post every change
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ["body", "base", "webhook_url"],
                    "msg": "a sweep's trials send no webhooks of their own: remove webhook_url from base (the "
                    "key's default webhook, POST /webhooks/url, gets every job's changes, trials included)",
                }
            ]
        )
    named: list[Any] = list(sweep.frameworks) if sweep.frameworks else [base.get("framework")]  # None: JobSpec says
    try:
        for framework in named:
            job = records.with_dataset(session, owner, JobSpec.model_validate({**base, "framework": framework}))
            if job.model.user_code:  # as POST /jobs checks it: allowed, the key's, a function of it
                code_records.check_job(session, owner, job, framework, get_settings())
            limits.check_spec(job, caller=owner)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ["body", "base", *e["loc"]]} for e in exc.errors(include_url=False)]
        ) from None
    except limits.SpecOverLimit as exc:
        raise RequestValidationError([{**e, "loc": ["body", "base", *e["loc"][1:]]} for e in exc.errors]) from None
    except RequestValidationError as exc:  # the dataset's and the code's checks, which name a job's fields
        raise RequestValidationError([{**e, "loc": ["body", "base", *e["loc"][1:]]} for e in exc.errors()]) from None
    return job.model_dump(mode="json")


def frameworks(sweep: SweepSpec, base: dict[str, Any]) -> list[Any]:
    """The frameworks every trial runs in."""
    return list(sweep.frameworks or [base["framework"]])


def check(sweep: SweepSpec, base: dict[str, Any]) -> None:
    """Raise RequestValidationError with every problem of the sweep's space, method and
    objective against its resolved `base` (resolve_base) in each of its frameworks; nothing
    when it can run."""
    errors = []
    for framework in frameworks(sweep, base):
        errors += [e for e in _space_errors(sweep, {**base, "framework": framework}) if e not in errors]
    errors += [*_method_errors(sweep), *_objective_errors(sweep, base)]
    if errors:
        raise RequestValidationError(errors)


def _space_errors(sweep: SweepSpec, base: dict[str, Any]) -> list[dict]:
    errors = []
    paths = known_paths()
    for path, dimension in sweep.space.items():
        if path in FIXED or path.startswith("dataset.info."):
            errors.append(_error(["space", path], f"{path} cannot be searched: {FIXED.get(path, 'set by the server')}"))
            continue
        for value in dimension.extremes():
            try:
                _check_job(trial_spec(base, {path: value}))
            except UnknownPath:
                errors.append(_error(["space", path], f"{path} does not name a field of a job spec"))
            except (ValidationError, limits.SpecOverLimit) as exc:
                if isinstance(exc, ValidationError) and exc.errors()[0]["type"] == "extra_forbidden":
                    near = _nearest(path, paths)
                    hint = f"; did you mean '{near[0]}'?" if near else "; GET /openapi.json lists a job spec's fields"
                    errors.append(_error(["space", path], f"{path} does not name a field of a job spec{hint}"))
                else:
                    errors.append(
                        _error(
                            ["space", path],
                            f"{dimension.kind} value {value!r} makes a job the server refuses ({_first_problem(exc)}); "
                            "keep the values within the field's limits",
                        )
                    )
            else:
                continue
            break  # one error per dimension: its first bad value
    return errors


def _nearest(path: str, paths: list[str]) -> list[str]:
    """The known path nearest to `path`: a sibling it abbreviates (`lr`: `learning_rate`), else
    the closest spelling among its siblings, then among every path."""
    parent, _, name = path.rpartition(".")
    siblings = [p for p in paths if p.rpartition(".")[0] == parent]
    abbreviated = [p for p in siblings if _abbreviates(name, p.rpartition(".")[2])]
    return (
        sorted(abbreviated, key=len)[:1]
        or difflib.get_close_matches(path, siblings, n=1, cutoff=0.5)
        or difflib.get_close_matches(path, paths, n=1)
    )


def _abbreviates(short: str, name: str) -> bool:
    """Whether `short` is `name` with letters left out, starting alike (lr: learning_rate)."""
    if not short or short[0] != name[0] or len(short) >= len(name):
        return False
    rest = iter(name)
    return all(ch in rest for ch in short)


def _method_errors(sweep: SweepSpec) -> list[dict]:
    if sweep.method != "grid":
        return []
    ranges = [path for path, d in sweep.space.items() if d.values() is None]
    if ranges:
        return [
            _error(
                ["space", path], f"method grid takes listed values (grid or choice), not a range; list {path}'s values"
            )
            for path in ranges
        ]
    if sweep.grid_size() > sweep.max_trials:
        return [
            _error(
                ["max_trials"],
                f"the grid has {sweep.grid_size()} points, more than max_trials {sweep.max_trials}: raise max_trials "
                "to the grid's size or list fewer values",
            )
        ]
    return []


def _objective_errors(sweep: SweepSpec, base: dict[str, Any]) -> list[dict]:
    errors = []
    shape = data_shape(JobSpec.model_validate(base).dataset)
    task = shape.task if shape is not None else "classification"
    metric = sweep.objective.metric
    if task == "classification" and metric in REGRESSION_ONLY or task == "regression" and metric in CLASSIFICATION_ONLY:
        fits = "test_accuracy (max)" if task == "classification" else "test_rmse (min) or test_r2 (max)"
        errors.append(
            _error(
                ["objective", "metric"], f"{metric} is not recorded for a {task} task; use {fits}, or test_loss (min)"
            )
        )
    epochs_searched = "epochs" in sweep.space
    if sweep.early_stopping and not epochs_searched and sweep.early_stopping.min_epochs >= base["epochs"]:
        errors.append(
            _error(
                ["early_stopping", "min_epochs"],
                f"min_epochs {sweep.early_stopping.min_epochs} is not below the trials' epochs {base['epochs']}: "
                "no trial could be stopped early; lower min_epochs or raise base.epochs",
            )
        )
    return errors
