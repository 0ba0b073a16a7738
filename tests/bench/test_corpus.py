"""Real published models, as users export and upload them (`bench.corpus`): each is exported, saved, loaded back
through the upload loader, imported (blocked layouts, the host), built untuned and checked against torch.

A fast subset runs by default; the whole corpus (every torchvision classification and segmentation model,
transformers with masks, every pytree form) with ALTUNE_TEST_CORPUS=1, as a slow test.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("torchvision") is None:  # importing it needs bench.corpus' stub
    pytest.skip("torchvision is not installed (pip install -e '.[dev]')", allow_module_level=True)

from bench import corpus  # noqa: E402

# a causal-mask GPT block (-Infinity), dict and nested outputs, nested and keyword inputs, a registered
# namedtuple, a torchvision model with hyphenated module paths (regnet) and a small classic one (squeezenet)
FAST = ["gpt_block", "transformer_encoder", "dict_out", "nested_out", "nested_in", "kwargs_in", "namedtuple_out",
        "squeezenet1_1"]


@pytest.fixture(scope="module")
def target():
    from compiler.target import resolve_target

    return resolve_target("host")


def test_the_corpus_has_every_kind():
    tv = corpus.import_torchvision()
    assert set(tv.models.list_models(module=tv.models)) <= set(corpus.CORPUS)
    assert {"deeplabv3_mobilenet_v3_large", "fcn_resnet50", "lraspp_mobilenet_v3_large"} <= set(corpus.CORPUS)
    assert {"gpt_block", "transformer_encoder", "transformer_decoder", "tuple_out", "list_out", "dict_out",
            "namedtuple_out", "nested_out", "tuple_in", "list_in", "dict_in", "nested_in",
            "kwargs_in"} <= set(corpus.CORPUS)


@pytest.mark.builds_model
@pytest.mark.parametrize("name", FAST)
def test_corpus_model_uploads_imports_and_matches_torch(name, target, tmp_path):
    row = corpus.check_model(name, target, tmp_path)
    assert row.matches and not row.failed, row.line()
    assert row.tasks and row.tasks > 0


@pytest.mark.builds_model
def test_segmentation_dict_output_matches_torch(target, tmp_path):
    """torchvision's segmentation models return {"out": ...}: lraspp is the smallest."""
    row = corpus.check_model("lraspp_mobilenet_v3_large", target, tmp_path)
    assert row.matches and not row.failed, row.line()


@pytest.mark.builds_model
def test_main_prints_a_row_per_model(capsys):
    assert corpus.main(["--models", "dict_out,tuple_in"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(corpus.HEADER) and "dict_out" in out and "tuple_in" in out
    assert "2/2 models match torch untuned" in out


@pytest.mark.builds_model
@pytest.mark.skipif(os.environ.get("ALTUNE_TEST_CORPUS") != "1", reason="the whole corpus takes hours: set "
                                                                          "ALTUNE_TEST_CORPUS=1")
@pytest.mark.parametrize("name", sorted(corpus.CORPUS))
def test_whole_corpus(name, target, tmp_path):
    row = corpus.check_model(name, target, tmp_path)
    assert row.matches and not row.failed, row.line()


def test_a_torchvision_model_at_another_batch_or_resolution_is_a_corpus_name():
    from bench.corpus_models import CORPUS

    assert "resnet18@b8" in CORPUS and "lraspp_mobilenet_v3_large@b2@64" in CORPUS
    assert "resnet18" in list(CORPUS) and "resnet18@b8" not in list(CORPUS)  # the listing: each model once
    for bad in ("resnet18@", "resnet18@b0", "resnet18@x", "gpt_block@b2", "nonesuch@b2"):
        assert bad not in CORPUS, bad
    module, args, kwargs = CORPUS["lraspp_mobilenet_v3_large@b2@64"]()
    assert tuple(args[0].shape) == (2, 3, 64, 64) and kwargs == {}
