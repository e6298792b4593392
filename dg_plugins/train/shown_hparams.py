"""Which hparams train's "HParams:" printout lists: all but the network hparams of networks the job
does not build and DomainBed's base hparams no algorithm reads. The records keep every hparam."""

from __future__ import annotations

#: The base hparams that configure a network: listed only where the job's network reads them.
MODEL_HPARAMS = frozenset({"backbone", "vit", "resnet18", "resnet50_augmix", "resnet_dropout",
                           "freeze_bn", "dinov2", "vit_arch", "vit_attn_tune", "vit_dropout",
                           "mnist_cnn_width", "pretrained", "pretrained_path",
                           "nonlinear_classifier"})

#: DomainBed's base hparams that no dg_plugins algorithm or network reads.
UNREAD_HPARAMS = frozenset({"lars", "linear_steps"})


def model_hparams(algorithm: str, input_shape, hparams: dict) -> set[str] | None:
    """The :data:`MODEL_HPARAMS` the network of ``algorithm`` reads (None: not known)."""
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
    """``(listed, left out)`` names of ``hparams``, sorted (all listed for an unknown network)."""
    used = model_hparams(algorithm, input_shape, hparams)
    if used is None:
        return sorted(hparams), []
    left_out = {name for name in hparams
                if name in UNREAD_HPARAMS or name in MODEL_HPARAMS and name not in used}
    return sorted(set(hparams) - left_out), sorted(left_out)


def print_hparams(algorithm: str, input_shape, hparams: dict) -> None:
    """DomainBed's "HParams:" block of the listed names, then the others on one line."""
    listed, left_out = shown_hparams(algorithm, input_shape, hparams)
    print("HParams:")
    for name in listed:
        print(f"\t{name}: {hparams[name]}")
    if left_out:
        print(f"\t(in the records, not read by this job: {', '.join(left_out)})")
