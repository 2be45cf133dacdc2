"""One model registry (``edgeplug._models``): one name per model, the name says what it is, and the
commands' model names (``edgeplug lower NAME``, ``edgeplug zoo --models NAME``) are views of it.

"llama" once named the hand-written decoder in ``edgeplug.examples`` and transformers' LlamaForCausalLM
in the zoo, each table defining its own models; `edgeplug lower llama` is deprecated now (the zoo keeps
the name). These tests fail when a table defines a model the registry does not hold, or a name comes to
mean two models without one of them deprecated.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import edgeplug._zoo._models as zoo_models
from edgeplug import _models
from edgeplug._api import model_renames
from edgeplug._errors import EdgeplugError
from edgeplug._models import EXAMPLE_NAMES, MODELS, PUBLIC_NAME_CLASHES, ZOO_NAMES, Model
from edgeplug.examples import EXAMPLES, list_examples, load_model
from edgeplug.testing.programs import mobilenet_blocks

#: each command's public model names: name -> registry name (both take every registry name as well)
VIEWS = {
    "edgeplug lower": {**{name: name for name in MODELS}, **EXAMPLE_NAMES},
    "edgeplug zoo": {**{name: name for name in MODELS}, **ZOO_NAMES},
}
#: each command's deprecated short model names (edgeplug._api.RENAMES, kind "model")
DEPRECATED = {command: set(model_renames(command)) for command in VIEWS}


def clashes(views: dict[str, dict[str, str]], deprecated: dict[str, set[str]]) -> dict[str, set[str]]:
    """Names that mean two models: public name -> the registry names it means, a command's deprecated
    short names left out (a clash is kept only while one side of it is deprecated)."""
    meanings: dict[str, set[str]] = {name: {name} for name in MODELS}
    for command, names in views.items():
        for public, name in names.items():
            if public not in deprecated.get(command, set()):
                meanings.setdefault(public, set()).add(name)
    return {public: means for public, means in meanings.items() if len(means) > 1}


def test_every_registered_name_maps_to_one_builder_and_no_model_has_two_names():
    built_by: dict[tuple, str] = {}
    for name, model in MODELS.items():
        assert model.name == name
        key = (model.builder, repr(model.options), repr(model.arch))
        assert key not in built_by, f"{name} and {built_by[key]} are one model under two names"
        built_by[key] = name


def test_a_second_model_of_a_registered_name_is_refused():
    first = Model("handwritten-mlp", "two linear layers", "edgeplug.examples.llama:small_mlp")
    other = Model("handwritten-mlp", "a different model", "edgeplug.examples.llama:tiny_llama")
    with pytest.raises(EdgeplugError, match="two built-in models are named 'handwritten-mlp'"):
        _models._table(first, other)


def test_the_commands_models_are_the_registrys_not_their_own():
    # edgeplug lower NAME: the registry's build and description, nothing defined beside them
    assert list(EXAMPLES) == list(EXAMPLE_NAMES)
    for public, name in EXAMPLE_NAMES.items():
        build, what = EXAMPLES[public]
        assert build.__self__ is MODELS[name] and what == MODELS[name].what == list_examples()[public]
    # edgeplug zoo --models NAME: the registry's transformers architectures, in the registry's order
    assert list(zoo_models.MODELS) == list(ZOO_NAMES)
    for public, name in ZOO_NAMES.items():
        assert zoo_models.MODELS[public] is MODELS[name].arch
    for command, names in VIEWS.items():
        unknown = sorted(set(names.values()) - set(MODELS))
        assert not unknown, f"{command} names models the registry does not hold: {unknown}"


def test_no_name_means_two_models_but_a_deprecated_one():
    found = clashes(VIEWS, DEPRECATED)
    assert not found, (
        f"names meaning two models: {found}; give the new model a name of its own, or deprecate one command's "
        "use of the name (edgeplug._api.RENAMES, kind 'model')"
    )
    # the clashes kept are deprecated, recorded, and each record says what each command means
    kept = clashes(VIEWS, {})
    assert set(kept) == set(PUBLIC_NAME_CLASHES), (kept, PUBLIC_NAME_CLASHES)
    for public, why in PUBLIC_NAME_CLASHES.items():
        assert any(public in names for names in DEPRECATED.values()), f"{public!r} clashes and is deprecated nowhere"
        assert all(name in why for name in kept[public]), why


def test_a_planted_clash_is_refused():
    zoo = {**VIEWS["edgeplug zoo"], "mlp": "transformers-bert"}  # a zoo model under lower's `mlp`
    assert clashes({**VIEWS, "edgeplug zoo": zoo}, DEPRECATED) == {"mlp": {"handwritten-mlp", "transformers-bert"}}
    assert clashes(VIEWS, {}) == {"llama": {"handwritten-llama-decoder", "transformers-llama"}}  # undeprecated


def test_each_deprecated_model_name_names_the_model_it_meant():
    for command, renames in ((c, model_renames(c)) for c in VIEWS):
        for old, rename in renames.items():
            new = rename.new.rpartition(" ")[2]
            assert rename.new == f"{command} {new}" and new in MODELS, rename
            assert VIEWS[command][old] == new, f"`{command} {old}` builds {VIEWS[command][old]}, its rename says {new}"


def test_each_name_says_which_family_the_model_is_of():
    for name, model in MODELS.items():
        family, _, what = name.partition("-")
        module = model.builder.partition(":")[0]
        if family == "handwritten":
            assert module == "edgeplug.examples.llama" and model.arch is None, name
        elif family == "transformers":
            assert model.arch is not None, name
            assert what.replace("-", "") in model.arch.model.lower(), f"{name} builds {model.arch.model}"
        elif family == "executorch":  # executorch's own Llama transformer, as it is or configured as another
            assert model.builder == "edgeplug.testing.programs:_executorch_llama", name
            assert what == "llama" or what.startswith("llama-"), name
        else:
            assert family == "testing" and module == "edgeplug.testing.programs", name


def test_a_registered_model_builds_what_its_name_says():
    mlp, (x,) = MODELS["handwritten-mlp"].build()
    same, (x_again,), _, _ = load_model("mlp")
    assert torch.equal(x, x_again) and torch.equal(mlp(x), same(x))
    v3, (image,) = MODELS["testing-mobilenet-v3-blocks"].build()
    direct, (image_again,) = mobilenet_blocks("v3")
    assert torch.equal(image, image_again) and torch.equal(v3(image), direct(image))
    assert any(isinstance(m, torch.nn.Hardswish) for m in v3.modules())  # v3, not v2
    et_llama, (tokens,) = MODELS["executorch-llama-as-qwen3"].build()
    assert type(et_llama).__module__.startswith("executorch.examples.models.llama") and et_llama.params.use_qk_norm
    forward, (ids,) = MODELS["transformers-llama"].build(layers=1)
    assert type(forward.model).__name__ == "LlamaForCausalLM" and forward.model.config.num_hidden_layers == 1
    zoo_forward, (zoo_ids,) = zoo_models.build("llama", 1)
    assert torch.equal(ids, zoo_ids) and torch.equal(forward(ids), zoo_forward(ids))


def test_listing_the_models_loads_neither_torch_nor_transformers():
    code = (
        "import sys, edgeplug._models as m, edgeplug.examples as e; assert m.MODELS and e.list_examples(); "
        "loaded = [x for x in ('torch', 'transformers') if x in sys.modules]; assert not loaded, loaded"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
