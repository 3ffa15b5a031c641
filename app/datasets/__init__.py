"""Uploaded datasets: read one uploaded file (npz, MNIST IDX in an archive, CSV, Parquet, an
ImageFolder zip) with its field's own library, never pickle, validate it once, and normalise it
to `trainers.dataset_file.DatasetArrays`.

- `formats`: the entry points, `detect_format` and `parse_upload`;
- `common`: the options, limits and `DatasetRejected`, and the checks every format shares;
- `archives`: zip, tar and gzip members read with caps on size and count (zip bombs);
- `arrays` (npz), `idx` (MNIST IDX), `tables` (CSV, Parquet), `images` (ImageFolder): one reader each.
"""
