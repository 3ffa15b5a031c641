"""ImageFolder uploads: a `.zip` laid out as torchvision's ImageFolder reads a folder,
`train/<class>/<image>` and optionally `test/<class>/<image>` (.png, .jpg, .jpeg), at the top
of the zip or inside one folder. Other files outside train/ and test/ (a README) are ignored.

Images are decoded with Pillow (PNG and JPEG decoders only), each checked against the
server's pixel cap (`UploadLimits.max_image_pixels`) from its header before its pixels are
decoded; Pillow's own decompression-bomb limit is not consulted, so the server's is the one a
refusal names. All grey (R = G = B) -> uint8 [N, H, W, 1], else [N, H, W, 3] RGB; resized to
`image_size` (bilinear) when given, else all must share one size. Classes are the sorted train
folder names, each a short printable name (`common.class_name_problem`).
"""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile, JpegImagePlugin, PngImagePlugin

from app.datasets.archives import Budget, is_junk, open_zip, read_zip_member, zip_files
from app.datasets.common import (
    EXAMPLES,
    PIXELS,
    DatasetRejected,
    UploadLimits,
    UploadOptions,
    check_classes,
    check_limit,
    check_not_empty,
    class_name_problem,
    finish,
    shown,
)
from trainers.dataset_file import DatasetArrays

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"
SPLITS = ("train", "test")


@dataclass(frozen=True)
class _Member:
    split: str
    class_name: str
    info: zipfile.ZipInfo


def read_imagefolder(path: Path, options: UploadOptions, limits: UploadLimits) -> DatasetArrays:
    """The ImageFolder zip at `path`, decoded, validated and normalised."""
    if options.task == "regression":
        raise DatasetRejected("ImageFolder labels are classes: use task='classification' (or upload an npz)", "task")
    if options.image_size is not None:
        height, width = options.image_size
        check_limit(
            height * width, limits.max_image_pixels, "pixels", "image_size", "pass a smaller image_size", PIXELS
        )
    budget = Budget(limits.max_unpacked_bytes)
    with open_zip(path) as archive:
        members = _layout(archive, limits)
        class_names = _class_names(members, limits)
        images = [_decode(archive, member.info, options, limits, budget) for member in members]
    x = _stack(images, members, options)
    y = np.array([class_names.index(member.class_name) for member in members], dtype=np.int32)
    test = np.array([member.split == "test" for member in members])
    x_test, y_test = (x[test], y[test]) if test.any() else (None, None)
    data = DatasetArrays(x[~test], y[~test], x_test, y_test, "classification", class_names, "imagefolder")
    return finish(data, limits, test_where="test/")


def _root(names: list[str]) -> str:
    """The prefix that holds train/: "" or the one folder that wraps everything."""
    tops = {name.split("/", 1)[0] for name in names}
    if "train" in tops:
        return ""
    if len(tops) == 1 and any(name.startswith(f"{top}/train/") for top in tops for name in names):
        return f"{tops.pop()}/"
    raise DatasetRejected(
        f"no train/ folder: lay the zip out as train/<class>/<image> (optionally test/<class>/<image>), at its top "
        f"or inside one folder; its top holds {', '.join(sorted(tops)[:10])}",
        "train/",
    )


def _layout(archive: zipfile.ZipFile, limits: UploadLimits) -> list[_Member]:
    """The images of train/ and test/, train first, each split by class then name."""
    files = [info for info in zip_files(archive, limits) if not is_junk(info.filename)]
    root = _root([info.filename for info in files])
    members = []
    for info in files:
        parts = info.filename.removeprefix(root).split("/")
        if not info.filename.startswith(root) or parts[0] not in SPLITS:
            continue
        if len(parts) < 3:
            raise DatasetRejected(
                f"{info.filename}: images go in {parts[0]}/<class>/<image>, one folder per class", info.filename
            )
        if not info.filename.lower().endswith(IMAGE_EXTENSIONS):
            raise DatasetRejected(
                f"{info.filename}: not a {'/'.join(IMAGE_EXTENSIONS)} file; convert it or take it out", info.filename
            )
        members.append(_Member(parts[0], parts[1], info))
    check_limit(len(members), limits.max_examples, "images", "archive", "upload a subset", EXAMPLES)
    if f"{root}test/" in archive.namelist() and not any(member.split == "test" for member in members):
        check_not_empty(0, "test/")
    return sorted(members, key=lambda m: (SPLITS.index(m.split), m.class_name, m.info.filename))


def _class_names(members: list[_Member], limits: UploadLimits) -> list[str]:
    """Sorted train class folders, each a short printable name; every test class must be one of them."""
    checked: set[str] = set()
    for member in members:
        if member.class_name not in checked:
            checked.add(member.class_name)
            if problem := class_name_problem(member.class_name):
                raise DatasetRejected(
                    f"{shown(member.info.filename, 300)}: the class folder's name {problem}; rename the folder "
                    "(class names are shown in terminals and the dashboard)",
                    member.info.filename,
                )
    class_names = sorted({member.class_name for member in members if member.split == "train"})
    for member in members:
        if member.split == "test" and member.class_name not in class_names:
            raise DatasetRejected(
                f"{member.info.filename}: class '{member.class_name}' is in test/ but not in train/; "
                "every test class needs train images",
                member.info.filename,
            )
    check_not_empty(len(class_names), "train/")
    check_classes(len(class_names), np.array(class_names), "train/", limits)
    return class_names


def _decode(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, options: UploadOptions, limits: UploadLimits, budget: Budget
) -> np.ndarray:
    """One image as uint8 [H, W] when grey (R = G = B), else [H, W, 3]."""
    name = info.filename
    data = read_zip_member(archive, info, budget)
    try:
        with _open_image(data, name) as image:
            width, height = image.size  # from the header: nothing is decoded yet
            check_limit(width * height, limits.max_image_pixels, "pixels", name, "resize the image", PIXELS)
            budget.take(width * height * 3, name)  # decoded pixels count as unpacked bytes too
            rgb = image.convert("RGB")
    # What Image.open catches from a format's class for a file that is not really that format.
    except (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError, struct.error) as exc:
        raise DatasetRejected(f"{name}: not a readable PNG or JPEG ({exc}); save it again", name) from exc
    if options.image_size is not None:
        height, width = options.image_size
        rgb = rgb.resize((width, height), Image.Resampling.BILINEAR)
    pixels = np.asarray(rgb)
    grey = bool((pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all())
    return pixels[..., 0].copy() if grey else pixels


def _open_image(data: bytes, name: str) -> ImageFile.ImageFile:
    """The PNG or JPEG in `data`, its header read and nothing decoded. The format's own class
    rather than Image.open, whose decompression-bomb check (Pillow's MAX_IMAGE_PIXELS, a
    process-wide setting) would refuse by its limit before the server's is checked."""
    if data.startswith(PNG_MAGIC):
        return PngImagePlugin.PngImageFile(io.BytesIO(data))
    if data.startswith(JPEG_MAGIC):
        return JpegImagePlugin.JpegImageFile(io.BytesIO(data))
    raise DatasetRejected(f"{name}: not a readable PNG or JPEG (not recognised as either); save it again", name)


def _stack(images: list[np.ndarray], members: list[_Member], options: UploadOptions) -> np.ndarray:
    """uint8 [N, H, W, C]: C = 3 when any image has colour, else 1. Without image_size all
    images must share one size."""
    first = images[0].shape[:2]
    for image, member in zip(images, members):
        if image.shape[:2] != first:
            raise DatasetRejected(
                f"{member.info.filename} is {image.shape[1]}x{image.shape[0]} but {members[0].info.filename} is "
                f"{first[1]}x{first[0]} (width x height): pass image_size to resize them all to one size",
                member.info.filename,
            )
    if any(image.ndim == 3 for image in images):
        return np.stack([image if image.ndim == 3 else np.repeat(image[..., None], 3, axis=2) for image in images])
    return np.stack(images)[..., np.newaxis]
