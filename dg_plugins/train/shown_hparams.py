"""Which hparams train's "HParams:" printout lists: every hparam but the base ones that configure
a network the job does not build (:data:`MODEL_HPARAMS`) and those of DomainBed's base space that
no dg_plugins algorithm reads (:data:`UNREAD_HPARAMS`). Network hparams are listed for the
algorithm builds: DomainBed's ``networks.Featurizer`` rule for ERM-shaped algorithms
(:func:`dg_plugins.networks.featurizers.backbone_for`: the MNIST CNN, LeNet, a ResNet, or the ViT
featurizer), the timm ViT of ERM_ViT and GMoE, or DisMAE's and MAE's encoders. The records keep
every hparam."""

from __future__ import annotations

#: The base hparams that configure a network (:func:`dg_plugins.hparams.base_space`): listed
#: only where the job's network reads them.
MODEL_HPARAMS = frozenset({
    "backbone", "vit", "resnet18", "resnet50_augmix", "resnet_dropout", "freeze_bn", "dinov2",
    "vit_arch", "vit_attn_tune", "vit_dropout", "mnist_cnn_width", "pretrained",
    "pretrained_path", "nonlinear_classifier",
})

#: DomainBed's base hparams that no dg_plugins algorithm or network reads (kept for the
#: compatibility of hparams and records).
UNREAD_HPARAMS = frozenset({"lars", "linear_steps"})


def model_hparams(algorithm: str, input_shape, hparams: dict) -> set[str] | None:
    """The names of :data:`MODEL_HPARAMS` that the network of ``algorithm`` on ``input_shape``
    reads, or None when that is not known (an algorithm that builds a network of its own, e.g. a
    plugin's: then every hparam is listed)."""
    from dg_plugins.algorithms.base import FeatureClassifier
    from dg_plugins.algorithms.dismae import MAE, DisMAE
    from dg_plugins.algorithms.gmoe import ERM_ViT
    from dg_plugins.networks.featurizers import backbone_for, resnet_arch
    from dg_plugins.registry import ALGORITHMS

    cls = ALGORITHMS.get(algorithm)
    if issubclass(cls, ERM_ViT):  # GMoE too: gmoe.build_vit
        return {"vit_arch", "pretrained", "pretrained_path"}
    if issubclass(cls, (DisMAE, MAE)):  # dismae.build_encoder: random initialisation
        return {"vit_arch"}
    if not issubclass(cls, FeatureClassifier):
        return None
    try:
        choice = backbone_for(input_shape, hparams)
    except ValueError:
        return None
    used = {"backbone", "nonlinear_classifier"}
    if choice == "mnist_cnn":
        used.add("mnist_cnn_width")
    elif choice == "resnet":
        arch_flag = "resnet18" if resnet_arch(hparams) == "resnet18" else "resnet50_augmix"
        used |= {arch_flag, "resnet_dropout", "freeze_bn", "pretrained", "pretrained_path"}
    elif choice == "vit":
        used |= {"dinov2", "vit_attn_tune", "vit_dropout", "pretrained", "pretrained_path"}
        if not hparams.get("dinov2"):
            used.add("vit_arch")
        if hparams.get("backbone", "auto") == "auto":
            used.add("vit")  # DomainBed's switch chose it
    return used


def shown_hparams(algorithm: str, input_shape, hparams: dict) -> tuple[list[str], list[str]]:
    """``(listed, left out)``: the names of ``hparams`` train lists, and those it leaves out (of
    :data:`MODEL_HPARAMS`, those the network does not read, :func:`model_hparams`; and
    :data:`UNREAD_HPARAMS`), each sorted; for an algorithm whose network is not known, every
    name is listed."""
    used = model_hparams(algorithm, input_shape, hparams)
    if used is None:
        return sorted(hparams), []
    left_out = {name for name in hparams
                if name in UNREAD_HPARAMS or name in MODEL_HPARAMS and name not in used}
    return sorted(set(hparams) - left_out), sorted(left_out)


def print_hparams(algorithm: str, input_shape, hparams: dict) -> None:
    """The "HParams:" block of a job's out.txt (DomainBed's, one ``name: value`` line each) with
    the names :func:`shown_hparams` lists, then the others named on one line."""
    listed, left_out = shown_hparams(algorithm, input_shape, hparams)
    print("HParams:")
    for name in listed:
        print(f"\t{name}: {hparams[name]}")
    if left_out:
        print(f"\t(in the records, not read by this job: {', '.join(left_out)})")
