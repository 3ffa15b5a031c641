"""Reading an uploaded code package: one `.py` file or a small `.zip`, checked once at upload.

Every file is named, never placed: a name is a relative path of plain parts (no absolute path,
no `..`, no backslash, no symlink in a zip), and only Python modules and a few text files are
kept. Sizes are capped before anything is decompressed (a zip's headers) and again while it is
(a member that lies about its size), so a zip bomb costs at most the limits. Each module must
parse (`ast`, never imported here); its top-level functions are the entrypoints a job may name.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".md", ".json", ".toml", ".cfg", ".yaml", ".yml")
MAX_RATIO = 100  # uncompressed / compressed bytes of one zip member: past it, a bomb
_MODULE_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEXT_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
ZIP_MAGIC = b"PK\x03\x04"
# Packages an import may name, and the framework they mean.
_FRAMEWORK_OF = {"torch": "pytorch", "flax": "jax", "jax": "jax", "optax": "jax"}


@dataclass(frozen=True)
class CodeLimits:
    """Caps on an upload (each a 413 past it)."""

    max_files: int = 64
    max_file_bytes: int = 256 * 1024
    max_unpacked_bytes: int = 4 * 1024**2


class CodeRejected(Exception):
    """Upload refused: `message` names the file and the fix; `status` 422, or 413 past a limit."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class Package:
    """Checked code: `files` {name: text} (names like "model.py", "blocks/attention.py"),
    `entrypoints` {"module:function": "pytorch" | "jax" | None (the source does not say)}."""

    files: dict[str, str]
    entrypoints: dict[str, str | None]

    def stored_form(self) -> bytes:
        """The one JSON object stored (sorted names): the same code always hashes the same."""
        return json.dumps(self.files, sort_keys=True, ensure_ascii=False).encode()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.stored_form()).hexdigest()


def read_package(path: Path, filename: str | None, limits: CodeLimits) -> Package:
    """The package in the uploaded file at `path` (a zip when it starts like one, else one Python
    file named by the client's `filename`, default "model.py"). Raises CodeRejected."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head == ZIP_MAGIC:
        files = _read_zip(path, limits)
    else:
        name = (filename or "model.py").replace("\\", "/").rsplit("/", 1)[-1]
        if not name.endswith(".py"):
            raise CodeRejected(f"{name!r} is neither a .py file nor a .zip: upload one Python file or a zip of them")
        size = path.stat().st_size
        if size > limits.max_file_bytes:
            raise CodeRejected(_over(name, size, limits.max_file_bytes, "max_code_file_bytes"), 413)
        files = {_checked_name(name): _text(name, path.read_bytes())}
    return Package(files=files, entrypoints=_entrypoints(files))


def _read_zip(path: Path, limits: CodeLimits) -> dict[str, str]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise CodeRejected(f"the upload is not a readable zip ({exc}): zip the .py files again") from None
    with archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
        if len(members) > limits.max_files:
            raise CodeRejected(
                f"the zip holds {len(members)} files, over the limit of {limits.max_files} (max_code_files, set "
                "by TRAINHUB_MAX_CODE_FILES); upload only the model's modules",
                413,
            )
        files: dict[str, str] = {}
        unpacked = 0
        for member in members:
            name = _checked_name(member.filename)
            if stat.S_ISLNK(member.external_attr >> 16):
                raise CodeRejected(f"{name!r} is a symlink: a package holds plain files only")
            if member.flag_bits & 0x1:
                raise CodeRejected(f"{name!r} is encrypted: zip it without a password")
            if member.file_size > limits.max_file_bytes:
                raise CodeRejected(_over(name, member.file_size, limits.max_file_bytes, "max_code_file_bytes"), 413)
            if member.file_size > MAX_RATIO * max(member.compress_size, 1) and member.file_size > 64 * 1024:
                raise CodeRejected(
                    f"{name!r} unpacks {member.file_size // max(member.compress_size, 1)}x its compressed size, "
                    f"over the ratio of {MAX_RATIO}x a zip bomb has",
                    413,
                )
            unpacked += member.file_size
            if unpacked > limits.max_unpacked_bytes:
                message = _over("the zip", unpacked, limits.max_unpacked_bytes, "max_code_unpacked_bytes")
                raise CodeRejected(message, 413)
            if name in files:
                raise CodeRejected(f"{name!r} is in the zip twice")
            # Read no more than the header says (+1, to catch a member that lies about its size).
            with archive.open(member) as f:
                data = f.read(member.file_size + 1)
            if len(data) > member.file_size:
                raise CodeRejected(f"{name!r} unpacks to more than its header says: the zip is damaged or crafted")
            files[name] = _text(name, data)
    if not any(name.endswith(".py") for name in files):
        raise CodeRejected("the zip holds no .py file: it needs the module that defines the entrypoint")
    return files


def _checked_name(raw: str) -> str:
    """`raw` as a package-relative name, or CodeRejected: no absolute path, `..`, backslash, or
    part that is not a plain Python module name (text files: letters, digits, `_.-`)."""
    shown = repr(raw[:100])
    if raw.startswith("/") or "\\" in raw or re.match(r"^[A-Za-z]:", raw):
        raise CodeRejected(f"{shown} is an absolute path or uses backslashes: a package's names are relative")
    parts = raw.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise CodeRejected(f"{shown} has an empty, '.' or '..' part: a package's names stay inside it")
    *folders, leaf = parts
    if not all(_MODULE_PART.match(part) for part in folders):
        raise CodeRejected(f"{shown}: folder names must be Python identifiers (they are packages)")
    if leaf.endswith(".py"):
        if not _MODULE_PART.match(leaf[:-3]):
            raise CodeRejected(f"{shown}: a module's name must be a Python identifier")
    elif not (leaf.endswith(TEXT_SUFFIXES) and _TEXT_PART.match(leaf)):
        raise CodeRejected(
            f"{shown} is not a .py file nor a text file ({', '.join(TEXT_SUFFIXES)}): upload code and text only"
        )
    return raw


def _text(name: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CodeRejected(f"{name!r} is not UTF-8 text (byte {exc.start}): save it as UTF-8") from None
    if "\x00" in text:
        raise CodeRejected(f"{name!r} holds a NUL byte: it is not source text")
    return text


def _over(what: str, size: int, limit: int, setting: str) -> str:
    return (
        f"{what} is {size:,} bytes, over the limit of {limit:,} ({setting}, set by TRAINHUB_{setting.upper()}); "
        "upload less code"
    )


def module_name(name: str) -> str:
    """The module a file defines: "blocks/attention.py" -> "blocks.attention", "pkg/__init__.py" -> "pkg"."""
    dotted = name[:-3].replace("/", ".")
    return dotted.removesuffix(".__init__")


def _entrypoints(files: dict[str, str]) -> dict[str, str | None]:
    """Every top-level function of every module, with the framework it builds for when its source
    says so; CodeRejected when a module does not parse."""
    found: dict[str, str | None] = {}
    for name, text in sorted(files.items()):
        if not name.endswith(".py"):
            continue
        try:
            tree = ast.parse(text, filename=name)
        except SyntaxError as exc:
            raise CodeRejected(f"{name!r} does not parse: line {exc.lineno}: {exc.msg}") from None
        imports = _imported_roots(tree)
        classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found[f"{module_name(name)}:{node.name}"] = _framework_of(node, imports, classes)
    return found


def _imported_roots(tree: ast.Module) -> dict[str, str]:
    """{name bound by a module-level import: the top package it comes from}."""
    roots: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                roots[(alias.asname or alias.name).split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                roots[alias.asname or alias.name] = node.module.split(".")[0]
    return roots


def _framework_of(function: ast.AST, imports: dict[str, str], classes: dict[str, ast.ClassDef]) -> str | None:
    """The one framework whose packages the function (and the module's classes it names, by
    their bases) refers to; None when it names none or both."""
    names = {node.id for node in ast.walk(function) if isinstance(node, ast.Name)}
    for cls in (classes[n] for n in names & classes.keys()):
        names |= {node.id for base in cls.bases for node in ast.walk(base) if isinstance(node, ast.Name)}
    frameworks = {_FRAMEWORK_OF[imports[n]] for n in names if imports.get(n) in _FRAMEWORK_OF}
    return frameworks.pop() if len(frameworks) == 1 else None
