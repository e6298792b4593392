"""Augmentation on the device (dg_plugins.datasets.device_augment) against torchvision's training
transforms: the split, the random draws (rates, ranges, per-image order), each operation against
torchvision's (float tensors: float tolerance; PIL: its 8-bit rounding), the distribution of the
outputs over many draws against torchvision's per-image pipeline, seeds, and CUDA where present.

Statistical checks allow 5 standard errors of the estimate from the number of draws (a false
failure about once in 1.7 million per check)."""

import math
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import dg_plugins.compat  # noqa: F401  (before torchvision)
from torchvision import transforms as T
from torchvision.transforms import functional as F

from dg_plugins.datasets import image_folder
from dg_plugins.datasets.device_augment import (
    Flip, Grayscale, Jitter, Normalize, device_augmentation, split_transform,
)
from dg_plugins.seeds import seeded_rng
from support.devices import needs_cuda
from support.image_tree import pacs_sample_dir

MEAN, STD = image_folder.IMAGENET_MEAN, image_folder.IMAGENET_STD
Z = 5  # standard errors allowed


def within(observed, expected, se, extra=0.0):
    return abs(observed - expected) <= Z * se + extra


def colour_image(size=32, seed=0):
    """A smooth random colour image (a 5x5 noise upsampled)."""
    noise = (np.random.default_rng(seed).random((5, 5, 3)) * 255).astype(np.uint8)
    return Image.fromarray(noise).resize((size, size), Image.BICUBIC)


def as_batch(image):
    return T.PILToTensor()(image)[None]


# the split ----------------------------------------------------------------------------------------

def test_split_of_each_training_transform():
    """DomainBed's and the DMG release's transforms: geometry in the loader (the very torchvision
    transforms, then PILToTensor), the rest on the device with torchvision's parameters."""
    expected = {
        "domainbed": ((0.7, 1.0), [Flip, Jitter, Grayscale, Normalize], 0.3, 0.1),
        "dmg_pacs": ((0.8, 1.0), [Flip, Jitter, Normalize], 0.4, None),
        "dmg_domainnet": (None, [Flip, Normalize], None, None),
    }
    for name, (scale, steps, jitter, gray) in expected.items():
        loader, device = device_augmentation(name)
        geometry = loader.transforms[:-1]
        assert isinstance(loader.transforms[-1], T.PILToTensor)
        if scale is None:  # Resize(256), RandomCrop(224)
            assert [type(t) for t in geometry] == [T.Resize, T.RandomCrop]
            assert geometry[0].size == 256 and tuple(geometry[1].size) == (224, 224)
        else:
            (crop,) = geometry
            assert isinstance(crop, T.RandomResizedCrop) and tuple(crop.size) == (224, 224)
            assert crop.scale == scale and crop.ratio == pytest.approx((3 / 4, 4 / 3))
        assert [type(s) for s in device.steps] == steps
        assert device.steps[0].p == 0.5
        if jitter is not None:
            b = (1 - jitter, 1 + jitter)
            for got, want in zip(device.steps[1].ranges, (b, b, b, (-jitter, jitter))):
                assert got == pytest.approx(want)
        if gray is not None:
            assert device.steps[2].p == gray
        assert device.steps[-1].mean == pytest.approx(MEAN)
        assert device.steps[-1].std == pytest.approx(STD)


def test_loader_part_is_torchvision_geometry():
    """Under the same RNG state, the loader part's pixels are those of the PIL path's own crop
    (RandomResizedCrop; Resize + RandomCrop): uint8 [3, 224, 224]."""
    image = colour_image(300)
    for name in ("domainbed", "dmg_domainnet"):
        loader, _ = device_augmentation(name)
        pil = image_folder.training_transform(name)
        geometry = T.Compose(pil.transforms[:1 if name == "domainbed" else 2])
        for seed in range(3):
            with seeded_rng(seed):
                x = loader(image)
            with seeded_rng(seed):
                expected = torch.from_numpy(np.array(geometry(image))).permute(2, 0, 1)
            assert x.dtype == torch.uint8 and x.shape == (3, 224, 224)
            assert torch.equal(x, expected)


def test_split_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="GaussianBlur.*is not one of"):
        split_transform(T.Compose([T.GaussianBlur(3), T.ToTensor()]))
    with pytest.raises(ValueError, match="RandomCrop comes after Flip"):
        split_transform(T.Compose([T.RandomHorizontalFlip(), T.RandomCrop(4), T.ToTensor()]))
    with pytest.raises(ValueError, match="no ToTensor"):
        split_transform(T.Compose([T.RandomCrop(4)]))
    _, device = device_augmentation("domainbed")
    with pytest.raises(ValueError, match=r"uint8 batch \[B, 3, H, W\], got torch.float32"):
        device(torch.zeros(2, 3, 8, 8), 0)


def test_missing_kornia_is_named_with_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "kornia", None)
    with pytest.raises(ImportError, match=r"pip install 'dg_plugins\[gpu\]'"):
        device_augmentation("domainbed")


# outputs, seeds -----------------------------------------------------------------------------------

def test_outputs_seeds_and_global_rng():
    """Float32 [B, 3, 224, 224], ImageNet-normalized; a function of (pixels, seed): the same
    seed gives the same batch, another seed another, and the global RNGs are untouched."""
    loader, device = device_augmentation("domainbed")
    with seeded_rng(0):
        x = torch.stack([loader(colour_image(227, seed=i)) for i in range(2)])
    state = torch.get_rng_state()
    y = device(x, 7)
    assert torch.equal(torch.get_rng_state(), state)
    assert y.dtype == torch.float32 and y.shape == (2, 3, 224, 224)
    lo = (0 - torch.tensor(MEAN)) / torch.tensor(STD)
    hi = (1 - torch.tensor(MEAN)) / torch.tensor(STD)
    per_channel = y.transpose(0, 1).flatten(1)
    assert (per_channel.amin(1) >= lo - 1e-5).all() and (per_channel.amax(1) <= hi + 1e-5).all()
    assert torch.equal(device(x, 7), y)
    assert not torch.equal(device(x, 8), y)
    # the draws depend on the seed alone, not on any RNG state
    torch.manual_seed(123)
    assert torch.equal(device(x, 7), y)


def test_normalization_is_totensor_then_normalize():
    image = colour_image()
    _, device = split_transform(T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)]))
    expected = T.Normalize(MEAN, STD)(T.ToTensor()(image))
    torch.testing.assert_close(device(as_batch(image), 0)[0], expected, rtol=0, atol=1e-6)


# each operation against torchvision's -------------------------------------------------------------

#: ColorJitter of one fixed factor per operation (a degenerate range), and its torchvision function.
FIXED = [
    ("brightness", 1.25, F.adjust_brightness), ("brightness", 0.7, F.adjust_brightness),
    ("contrast", 0.75, F.adjust_contrast), ("contrast", 1.3, F.adjust_contrast),
    ("saturation", 1.3, F.adjust_saturation), ("saturation", 0.6, F.adjust_saturation),
    ("hue", 0.2, F.adjust_hue), ("hue", -0.35, F.adjust_hue),
]


@pytest.mark.parametrize("name,factor,function", FIXED, ids=[f"{n}{f}" for n, f, _ in FIXED])
def test_each_jitter_operation_matches_torchvision(name, factor, function):
    """On float tensors the same numbers as torchvision's up to its luma weight for red (0.2989;
    kornia and PIL: 0.299), a difference under 1e-4. Against PIL within PIL's 8-bit arithmetic:
    it truncates each blend (< 1/255) and rounds the gray mean or gray image it blends with
    (<= 0.5/255); its hue works on 8-bit H, S, V (an error of about 6 * chroma * 1.5/256 of a
    turn: up to about 10/255 in RGB, measured 0.5-0.9/255 on average)."""
    image = colour_image()
    _, device = split_transform(T.Compose([T.ColorJitter(**{name: (factor, factor)}),
                                           T.ToTensor()]))
    ours = device(as_batch(image), 0)[0]
    torch.testing.assert_close(ours, function(T.ToTensor()(image), factor), rtol=0, atol=1e-4)
    error = (ours - T.ToTensor()(function(image, factor))).abs() * 255
    if name == "hue":
        assert error.max() <= 12 and error.mean() <= 1.5
    else:
        assert error.max() <= 1.5


def test_flip_and_grayscale_match_pil():
    image = colour_image()
    _, device = split_transform(T.Compose([T.RandomHorizontalFlip(1.0), T.RandomGrayscale(1.0),
                                           T.ToTensor()]))
    expected = T.ToTensor()(F.to_grayscale(F.hflip(image), num_output_channels=3))
    ours = device(as_batch(image), 0)[0]
    assert torch.equal(ours[0], ours[1]) and torch.equal(ours[1], ours[2])
    assert (ours - expected).abs().max() * 255 <= 0.5 + 1e-3  # PIL rounds the luma to 8 bits


def test_jitter_applies_each_image_its_own_order_and_factors():
    """Image i gets torchvision's four operations with its own factors in its own drawn order
    (not one order per batch, as kornia's ColorJitter and torchvision's v2 transforms do)."""
    jitter = T.ColorJitter(0.4, 0.4, 0.4, 0.4)
    _, device = split_transform(T.Compose([jitter, T.ToTensor()]))
    images = torch.cat([as_batch(colour_image(16, seed=i)) for i in range(24)])
    ours = device(images, 3)
    (order, factors), = device.draw(len(images), 3)
    assert len({tuple(o) for o in order.tolist()}) > 1
    functions = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    for i in range(len(images)):
        x = images[i].float() / 255
        for op in order[i].tolist():
            x = functions[op](x, float(factors[i, op]))
        # luma weights differ by 1e-4 (see test_each_jitter_operation_matches_torchvision)
        torch.testing.assert_close(ours[i], x, rtol=0, atol=2e-4)


# the draws ----------------------------------------------------------------------------------------

def test_draws_follow_torchvision_distributions():
    """Over many images: flip rate 0.5, grayscale rate 0.1, factors uniform on torchvision's
    ranges ([1 - 0.3, 1 + 0.3], hue [-0.3, 0.3]: 10 equal bins), and each image's jitter order
    uniform over the 24 orders (torchvision's randperm(4) per image)."""
    _, device = device_augmentation("domainbed")
    n = 48_000
    flipped, (order, factors), gray, _ = device.draw(n, 11)
    for drawn, p in ((flipped, 0.5), (gray, 0.1)):
        assert within(drawn.float().mean().item(), p, math.sqrt(p * (1 - p) / n))
    bounds = device.steps[1].ranges
    for op, (lo, hi) in enumerate(bounds):
        f = factors[:, op]
        assert lo <= f.min() and f.max() <= hi
        counts = torch.histc(f, bins=10, min=lo, max=hi)
        assert all(within(c.item(), n / 10, math.sqrt(n * 0.1 * 0.9)) for c in counts)
    assert torch.equal(order.sort(dim=1).values, torch.arange(4).expand(n, 4))
    _, counts = torch.unique(order, dim=0, return_counts=True)
    assert len(counts) == 24
    assert all(within(c.item(), n / 24, math.sqrt(n / 24 * 23 / 24)) for c in counts)


# outputs over many draws against torchvision's per-image pipeline ---------------------------------

N = 1000
#: DomainBed's training transform at a small output size (the statistics do not depend on it).
SMALL = 12


def small_domainbed():
    """DomainBed's training transform, its crop resized to SMALL x SMALL."""
    steps = list(image_folder.training_transform("domainbed").transforms)
    crop = steps[0]
    steps[0] = T.RandomResizedCrop(SMALL, scale=crop.scale, ratio=crop.ratio,
                                   interpolation=crop.interpolation, antialias=crop.antialias)
    return steps


def asymmetric_image():
    """Left half dark gray, right half a light colour (luma kept above the left half's under
    any jitter), with darker rows; a crop of area >= 0.7 keeps the centre column, so an output's
    left quarter comes from the left half unless flipped."""
    a = np.zeros((40, 40, 3))
    a[:, :20] = 0.2
    a[:, 20:] = (0.75, 0.55, 0.4)
    a[::4] *= 0.8
    return Image.fromarray((a * 255).round().astype(np.uint8))


def statistics(y):
    """Per image: flipped (left quarter brighter), grayscale (equal channels), mean luma,
    contrast (luma std), chroma (mean channel spread), mean red, mean blue."""
    y = y * torch.tensor(STD).view(3, 1, 1) + torch.tensor(MEAN).view(3, 1, 1)
    luma = 0.299 * y[:, 0] + 0.587 * y[:, 1] + 0.114 * y[:, 2]
    quarter = SMALL // 4
    spread = y.amax(1) - y.amin(1)
    return {
        "flipped": (luma[..., :quarter].mean((1, 2)) > luma[..., -quarter:].mean((1, 2))).double(),
        "gray": (spread.amax((1, 2)) < 1e-3).double(),
        "luma": luma.mean((1, 2)).double(), "contrast": luma.std((1, 2)).double(),
        "chroma": spread.mean((1, 2)).double(),
        "red": y[:, 0].mean((1, 2)).double(), "blue": y[:, 2].mean((1, 2)).double(),
    }


@pytest.fixture(scope="module")
def samples():
    """N outputs of each pipeline on :func:`asymmetric_image`: ours (loader part then device
    part), torchvision's on float tensors (ToTensor right after the crop: no 8-bit rounding)
    and torchvision's PIL path (DomainBed's as it runs)."""
    image = asymmetric_image()
    steps = small_domainbed()
    pil = T.Compose(steps)
    tensor = T.Compose([steps[0], steps[4], *steps[1:4], steps[5]])
    loader, device = split_transform(pil)
    with seeded_rng(1):
        crops = torch.stack([loader(image) for _ in range(N)])
    ours = torch.cat([device(crops[i:i + 500], i) for i in range(0, N, 500)])
    with seeded_rng(2):
        reference = torch.stack([tensor(image) for _ in range(N)])
    with seeded_rng(3):
        pil_outputs = torch.stack([pil(image) for _ in range(N)])
    return statistics(ours), statistics(reference), statistics(pil_outputs)


def test_flip_and_grayscale_rates_of_outputs(samples):
    ours, reference, pil = samples
    for key, p in (("flipped", 0.5), ("gray", 0.1)):
        rate = ours[key].mean().item()
        assert within(rate, p, math.sqrt(p * (1 - p) / N)), (key, rate)
        for other in (reference, pil):
            assert within(rate, other[key].mean().item(), math.sqrt(2 * p * (1 - p) / N))


def _mean_and_variance_se(x):
    """(mean, its standard error, variance, its standard error (from the fourth moment))."""
    n = len(x)
    mean, variance = x.mean().item(), x.var().item()
    m4 = ((x - mean) ** 4).mean().item()
    return mean, math.sqrt(variance / n), variance, math.sqrt(max(m4 - variance ** 2, 0) / n)


@pytest.mark.parametrize("key", ["luma", "contrast", "chroma", "red", "blue"])
def test_colour_statistics_of_outputs(samples, key):
    """Mean and variance over images of each statistic: ours against torchvision's float path
    within 5 standard errors; against the PIL path the means also within its 8-bit arithmetic
    (4 blends, each truncating < 1/255, and its 8-bit hue: at most 5/255 in all)."""
    ours, reference, pil = (_mean_and_variance_se(s[key]) for s in samples)
    for other, extra in ((reference, 0.0), (pil, 5 / 255)):
        assert within(ours[0], other[0], math.hypot(ours[1], other[1]), extra), (ours, other)
    assert within(ours[2], reference[2], math.hypot(ours[3], reference[3])), (ours, reference)


# integration --------------------------------------------------------------------------------------

def test_an_image_folder_batch_through_both_parts():
    """A PACS sample's domain with the loader part as its transform gives uint8 items; their
    collated batch, augmented on the device, is what the model reads."""
    from dg_plugins.datasets.image_folder import PACS

    loader, device = device_augmentation("domainbed")
    dataset = PACS(str(pacs_sample_dir()), [0], {"data_augmentation": True})
    env = dataset[1].with_transform(loader)
    with seeded_rng(5):
        x = torch.stack([env[i][0] for i in range(3)])
    assert x.dtype == torch.uint8 and x.shape == (3, 3, 224, 224)
    assert device(x, 5).shape == (3, 3, 224, 224)


@needs_cuda
def test_cuda_gives_the_cpu_numbers():
    """The draws are made on the CPU, so a batch on CUDA gets the CPU's parameters: the same
    output up to float32 rounding (hue's HSV round trip), the CUDA RNG untouched."""
    loader, device = device_augmentation("domainbed")
    with seeded_rng(0):
        x = torch.stack([loader(colour_image(227, seed=i)) for i in range(8)])
    state = torch.cuda.get_rng_state()
    on_cuda = device(x.to("cuda"), 9)
    assert on_cuda.device.type == "cuda" and torch.equal(torch.cuda.get_rng_state(), state)
    torch.testing.assert_close(on_cuda.cpu(), device(x, 9), rtol=0, atol=1e-3)
