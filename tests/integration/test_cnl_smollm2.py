"""CNL on the real SmolLM2-135M: erasing the neurons located on Emotion lowers Emotion accuracy
far more than erasing as many random neurons (same count per layer, several draws).

Sizes are kept small for the shared CPU: 12 training samples located with ``method="joint"``
(the cheaper IG estimator: all layers scaled together, S = 20), σ = 3 (at n = 12 the σ-mask
keeps ~1 % of the neurons; the paper's 0.1–0.3 % needs more data and larger σ), 30 held-out
test samples (the data bundled with tlcap). Measured on the bundled data: base 0.233, located
erased 0.033, random erased 0.233 (2 draws). SmolLM2-135M answers " sadness" for every Emotion
text we scored (600 distinct test texts), so its base accuracy is the share of sadness in the draw (0.29 on the
300 bundled test samples); the base-accuracy check below is against uniform chance (1/6) only.
"""

from __future__ import annotations

import pytest

from tlcap.runtime.run_control import RunControl

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]  # one_thread: tests/conftest.py




def test_erasing_emotion_neurons_beats_random(smollm2):
    from tlcap.data.tasks import load_task
    from tlcap.experiments.cnl import cnl_locate, erase_effect

    train = load_task("emotion", split="train", n=12, seed=0)
    test = load_task("emotion", split="test", n=30, seed=1)
    loc = cnl_locate(smollm2, "emotion", train, sigma=3.0, method="joint", convergence_points=1, run=RunControl(progress=False))
    ns = loc.neuron_set()
    assert 0 < loc.neuron_ratio < 0.05
    er = erase_effect(smollm2, "emotion", test, ns, n_random=2, seed=0)
    assert er.base_accuracy > 1 / 6  # above uniform chance (see the module docstring)
    assert er.located_accuracy < er.random_accuracy - 0.1
    assert er.located_accuracy < er.base_accuracy - 0.1
    assert er.random_accuracy > er.base_accuracy - 0.1  # random neurons of the same count barely matter
