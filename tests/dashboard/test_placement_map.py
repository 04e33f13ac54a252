"""The Live page's sidebar map of expert placement, drawn by the server."""

from dashboard.placement import placement_map


def test_placement_map_shows_each_experts_rank_and_replicas() -> None:
    info = {
        "ep_size": 2,
        "mode": "measured",
        "version": 3,
        "placement": [[[0, 1, 2], [2, 3]], [[3, 1], [0, 2]]],
    }
    fig = placement_map(info)
    (heat,) = fig.data
    assert [list(row) for row in heat.z] == [[0, 0, 0, 1], [1, 0, 1, 0]]
    assert [list(row) for row in heat.text] == [["", "", "0+1", ""], ["", "", "", ""]]
    assert fig.layout.title.text == "Placement v3 (measured)"
    assert fig.layout.xaxis.title.text == "expert" and fig.layout.yaxis.title.text == "layer"
    assert fig.layout.height == 90 + 25 * 4  # four layers' height at least
