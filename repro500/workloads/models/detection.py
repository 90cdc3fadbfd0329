"""Faster R-CNN for multi-channel climate fields (HPC AI500's Extreme Weather workload).

Built from torchvision's own detection pieces (``resnet_fpn_backbone``, ``mobilenet_backbone``,
``FasterRCNN``); only three things are adapted to 16-channel climate fields:

* the backbone's first convolution takes ``in_channels`` channels;
* ``GeneralizedRCNNTransform`` normalises with the data's own per-channel statistics
  (``image_mean`` / ``image_std``: the trainer passes the dataset's ``channel_mean`` /
  ``channel_std``; torchvision's defaults are 3 RGB ImageNet statistics).  The loader hands
  the file's values over unchanged, so this pass, which the transform makes anyway, is the
  only normalisation;
* ``min_size`` / ``max_size`` default to the dataset's native 768x1152, so images are not
  rescaled, and smaller values plus small anchors and fewer proposals give a CPU-sized model.

Never pretrained: with no weights torchvision trains every layer and uses ordinary
BatchNorm (frozen BatchNorm statistics only make sense for a pretrained backbone).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from repro500.errors import UsageError

DETECTION_BACKBONES = {
    "fasterrcnn_resnet18_fpn": "resnet18",
    "fasterrcnn_resnet50_fpn": "resnet50",
    "fasterrcnn_mobilenet_v3_fpn": "mobilenet_v3_large",
}

# Extreme Weather images are 768 x 1152 (Racah et al. 2017): keep them at native size.
EWA_HEIGHT_PX = 768
EWA_WIDTH_PX = 1152
DEFAULT_ANCHOR_SIZES_PX = (32, 64, 128, 256, 512)


def _resnet_backbone(backbone_name: str, in_channels: int) -> tuple[nn.Module, int]:
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    backbone = resnet_fpn_backbone(
        backbone_name=backbone_name, weights=None, norm_layer=nn.BatchNorm2d, trainable_layers=5
    )
    if in_channels != 3:
        conv = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
        backbone.body.conv1 = conv
    return backbone, 5  # feature maps: 4 FPN levels + the extra max-pooled one


def _mobilenet_backbone(backbone_name: str, in_channels: int) -> tuple[nn.Module, int]:
    from torchvision.models.detection.backbone_utils import mobilenet_backbone

    backbone = mobilenet_backbone(
        backbone_name=backbone_name,
        weights=None,
        fpn=True,
        norm_layer=nn.BatchNorm2d,
        trainable_layers=6,
    )
    if in_channels != 3:
        stem = backbone.body["0"][0]  # Conv2dNormActivation -> its convolution
        conv = nn.Conv2d(
            in_channels, stem.out_channels, kernel_size=3, stride=2, padding=1, bias=False
        )
        nn.init.kaiming_normal_(conv.weight, mode="fan_out")
        backbone.body["0"][0] = conv
    return backbone, 3  # feature maps: 2 returned stages + the extra max-pooled one


def faster_rcnn(
    name: str,
    *,
    num_classes: int = 5,
    in_channels: int = 16,
    min_size: int = EWA_HEIGHT_PX,
    max_size: int = EWA_WIDTH_PX,
    anchor_sizes: Sequence[int] | None = None,
    aspect_ratios: Sequence[float] = (0.5, 1.0, 2.0),
    rpn_pre_nms_top_n: int | None = None,
    rpn_post_nms_top_n: int | None = None,
    rpn_batch_size_per_image: int = 256,
    box_batch_size_per_image: int = 512,
    box_detections_per_img: int = 100,
    box_score_thresh: float = 0.05,
    image_mean: Sequence[float] | None = None,
    image_std: Sequence[float] | None = None,
) -> nn.Module:
    """Build a randomly initialised Faster R-CNN ``name`` for ``in_channels``-channel images.

    ``num_classes`` counts the background (Extreme Weather: 4 event classes + 1 = 5).
    ``anchor_sizes`` are in pixels of the (possibly resized) image: for ResNet backbones one
    size per feature map (5), for MobileNet any number, all used on each of its 3 maps.
    ``rpn_pre_nms_top_n`` / ``rpn_post_nms_top_n`` apply to training and evaluation alike
    (torchvision's defaults, 2000/1000 and 2000/1000, when not given).
    ``image_mean`` / ``image_std``: one value per input channel to normalise with (default 0
    and 1: images already normalised).
    """
    from torchvision.models.detection import FasterRCNN

    _check_name_and_classes(name, num_classes)
    mean, std = _channel_statistics(name, in_channels, image_mean, image_std)
    _check_image_sizes(name, min_size, max_size)
    backbone_name = DETECTION_BACKBONES[name]
    if backbone_name.startswith("resnet"):
        backbone, feature_maps = _resnet_backbone(backbone_name, in_channels)
    else:
        backbone, feature_maps = _mobilenet_backbone(backbone_name, in_channels)
    anchors = _anchor_generator(name, backbone_name, feature_maps, anchor_sizes, aspect_ratios)
    proposal_limits = _proposal_limits(rpn_pre_nms_top_n, rpn_post_nms_top_n)
    return FasterRCNN(
        backbone,
        num_classes=num_classes,
        min_size=min_size,
        max_size=max_size,
        image_mean=mean,
        image_std=std,
        rpn_anchor_generator=anchors,
        rpn_batch_size_per_image=rpn_batch_size_per_image,
        box_batch_size_per_image=box_batch_size_per_image,
        box_detections_per_img=box_detections_per_img,
        box_score_thresh=box_score_thresh,
        **proposal_limits,
    )


def _check_name_and_classes(name: str, num_classes: int) -> None:
    if name not in DETECTION_BACKBONES:
        raise UsageError(
            f"unknown detection model {name!r}; choose one of {', '.join(DETECTION_BACKBONES)}."
        )
    if num_classes < 2:
        raise UsageError(
            f"detection model {name} needs num_classes >= 2 (classes + background), got {num_classes}."
        )


def _channel_statistics(
    name: str, in_channels: int, image_mean: Sequence[float] | None, image_std: Sequence[float] | None
) -> tuple[list[float], list[float]]:
    """The per-channel mean and std the transform normalises with: one each per input channel."""
    mean = [0.0] * in_channels if image_mean is None else [float(v) for v in image_mean]
    std = [1.0] * in_channels if image_std is None else [float(v) for v in image_std]
    if len(mean) != in_channels or len(std) != in_channels or min(std) <= 0:
        raise UsageError(
            f"detection model {name}: image_mean and image_std need {in_channels} values each "
            f"(std > 0), got {len(mean)} and {len(std)}."
        )
    return mean, std


def _check_image_sizes(name: str, min_size: int, max_size: int) -> None:
    if min_size <= 0 or max_size < min_size:
        raise UsageError(
            f"detection model {name}: need 0 < min_size <= max_size, got {min_size} and {max_size}."
        )


def _anchor_generator(
    name: str,
    backbone_name: str,
    feature_maps: int,
    anchor_sizes: Sequence[int] | None,
    aspect_ratios: Sequence[float],
) -> nn.Module:
    """Anchors for each feature map: a ResNet FPN takes one size per map, a MobileNet all on each."""
    from torchvision.models.detection.anchor_utils import AnchorGenerator

    sizes = tuple(int(s) for s in (anchor_sizes or DEFAULT_ANCHOR_SIZES_PX))
    if backbone_name.startswith("resnet"):
        if len(sizes) != feature_maps:
            raise UsageError(
                f"detection model {name} needs {feature_maps} anchor_sizes (one per feature map), got {len(sizes)}."
            )
        per_map_sizes = tuple((size,) for size in sizes)
    else:
        per_map_sizes = (sizes,) * feature_maps
    ratios = (tuple(float(r) for r in aspect_ratios),) * feature_maps
    return AnchorGenerator(per_map_sizes, ratios)


def _proposal_limits(rpn_pre_nms_top_n: int | None, rpn_post_nms_top_n: int | None) -> dict[str, int]:
    """FasterRCNN's keyword arguments for the RPN's proposal counts, training and evaluation alike
    (none given: torchvision's defaults)."""
    limits = {}
    if rpn_pre_nms_top_n is not None:
        limits.update(
            rpn_pre_nms_top_n_train=rpn_pre_nms_top_n, rpn_pre_nms_top_n_test=rpn_pre_nms_top_n
        )
    if rpn_post_nms_top_n is not None:
        limits.update(
            rpn_post_nms_top_n_train=rpn_post_nms_top_n, rpn_post_nms_top_n_test=rpn_post_nms_top_n
        )
    return limits
