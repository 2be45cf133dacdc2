"""External weights on the Vulkan delegate (issue 27): its preprocess stores every constant in executorch's
named data, untagged; ``lower(..., external_weights=True)`` puts them into one ``.ptd`` beside the ``.pte``,
and host verification reads them from there. (This machine has no Vulkan runtime to run the pair.)"""

from __future__ import annotations

import re

import pytest

import edgeplug
from edgeplug.examples.llama import tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def decoder():
    return tiny_llama()


def _constants_read(result) -> int:
    found = re.search(r"(\d+) constants read from named data", result.report.verification.note or "")
    return int(found.group(1)) if found else 0


def test_the_weights_go_to_one_ptd_and_verify_from_there(decoder, tmp_path):
    model, args = decoder
    external = edgeplug.lower(model, args, "vulkan", external_weights=True, verify=True)
    assert external.report.verification.passed, external.report.verification.failures()
    # host verification read the delegated constants from the .ptd's named data (26 with the weights inline)
    assert _constants_read(external) == 26
    external.save(tmp_path / "m.pte")
    files = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    assert sorted(files) == ["m.ptd", "m.pte"]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert files["m.ptd"] >= 0.95 * weights
    assert files["m.pte"] < 0.1 * files["m.ptd"]


def test_vulkan_offers_external_weights():
    assert edgeplug.get_backend("vulkan").spec.external_weights
