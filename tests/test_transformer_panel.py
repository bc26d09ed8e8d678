"""Chapter 10's run panel never offers a layout whose expert ranks are not data-parallel ranks."""

import ipywidgets as widgets

from dsgd_teach.transformer.panel import keep_experts_on_data_ranks


def test_the_expert_and_data_dropdowns_keep_ep_dividing_dp():
    dp = widgets.Dropdown(options=[1, 2, 4, 8], value=2)
    ep = widgets.Dropdown(options=[1, 2, 4, 8], value=2)
    keep_experts_on_data_ranks(dp, ep)
    seen = []
    for widget, value in ((dp, 1), (ep, 4), (dp, 2), (dp, 8), (ep, 2), (ep, 8), (dp, 4)):
        widget.value = value
        assert dp.value % ep.value == 0, (dp.value, ep.value)
        seen.append((dp.value, ep.value))
    assert seen == [(1, 1), (4, 4), (2, 2), (8, 2), (8, 2), (8, 8), (4, 4)]
