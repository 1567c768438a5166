"""The trainer-extension registry: which extensions apply to a config, in which order, and
what an extension that overrides nothing does."""
import pytest
import torch
from detectron2.config import get_cfg

from fcos_d2 import add_fcos_config
from fcos_d2.trainer_extensions import (TrainerExtension, register_trainer_extension,
                                        registered_trainer_extensions,
                                        trainer_extensions_for, unregister_trainer_extension)


class First(TrainerExtension):
    name = "test_first"
    meta_architectures = ("FCOS", "SipMask")


class Second(TrainerExtension):
    name = "test_second"

    def applies(self, cfg):
        return cfg.MODEL.FCOS.NUM_CLASSES == 3


def cfg_of(meta_architecture: str, num_classes: int = 80):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.MODEL.META_ARCHITECTURE = meta_architecture
    cfg.MODEL.FCOS.NUM_CLASSES = num_classes
    return cfg


@pytest.fixture
def registered():
    """First and Second registered for one test; the registry as it was afterwards."""
    before = registered_trainer_extensions()
    first, second = register_trainer_extension(First()), register_trainer_extension(Second())
    yield first, second
    unregister_trainer_extension(First.name)
    unregister_trainer_extension(Second.name)
    assert registered_trainer_extensions() == before


def test_extensions_apply_by_meta_architecture_or_their_own_rule_in_registration_order(
        registered):
    first, second = registered
    ours = lambda cfg: [e for e in trainer_extensions_for(cfg) if e in registered]  # noqa: E731
    assert ours(cfg_of("FCOS")) == [first]
    assert ours(cfg_of("SipMask", num_classes=3)) == [first, second]
    assert ours(cfg_of("GeneralizedRCNN", num_classes=3)) == [second]
    assert ours(cfg_of("GeneralizedRCNN")) == []


def test_registering_a_name_again_replaces_the_extension(registered):
    replacement = register_trainer_extension(First())
    names = [e.name for e in registered_trainer_extensions()]
    assert names.count("test_first") == 1
    assert replacement in registered_trainer_extensions()
    assert registered[0] not in registered_trainer_extensions()


def test_an_extension_without_a_name_is_refused_naming_its_class():
    class Nameless(TrainerExtension):
        pass

    with pytest.raises(ValueError, match="trainer extension Nameless: set its class attribute"):
        register_trainer_extension(Nameless())


def test_an_extension_that_overrides_nothing_changes_nothing():
    extension, cfg, model = TrainerExtension(), cfg_of("FCOS"), torch.nn.Linear(1, 1)
    before = cfg.dump()
    extension.check_config(cfg)
    extension.adjust_config(cfg)
    extension.after_load(model, cfg, resuming=False)
    assert cfg.dump() == before
    mapper = object()
    assert extension.test_mapper(cfg, mapper) is mapper
    assert extension.test_model(cfg, model) == (model, "")
    assert extension.hooks(cfg) == []
    assert not extension.applies(cfg)  # no meta_architectures: applies to none
