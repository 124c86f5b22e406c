"""``unity-eq explain PLAN --format dot|svg|html``: a plan as pictures, drawn from plan.json alone.

Users would rather look than read a plan, so three pictures complement the text report of
:mod:`unity_eq.explain`:

* **the parallel computation graph** (:func:`pcg_graph`): one node per op, filled by its placement (one colour
  per placement, a legend lists them), activations as edges; an edge that crosses a collective is marked (red
  and bold in the forward pass, blue and dashed in the backward pass) and labelled with the collective's kind,
  mesh axis, bytes per rank and predicted time. Ops are grouped by the first part of their source name
  (``attn.q.matmul`` in ``attn``) and past ``max_ops`` the rest is left out with a note, so a large model stays
  readable;
* **the mesh on the machine's nodes** (:func:`mesh_svg`, and a cluster of the DOT graph): each node a box of
  its ranks with their mesh coordinates;
* **the cost split** (:func:`cost_chart_svg`): compute and communication per axis and phase of this plan next
  to the baselines, and memory per device against the usable capacity.

The graph is DOT text made with the ``graphviz`` package; the ``dot`` program (Debian's ``graphviz``) renders
it. Without ``dot``, ``--format svg`` writes the DOT text instead and says so, and the HTML page carries the
DOT text where the graph would be. The other two pictures are SVG written here, so the HTML page is one
self-contained file: inline SVG and CSS, no script, nothing fetched.

=======  ==================================================================================================
module   what it does
=======  ==================================================================================================
page     ``write_picture`` (the command: dot, svg or html) and the HTML page holding the three pictures
pcg      the parallel computation graph as a graphviz ``Digraph``, its DOT text, and ``render_svg``
mesh     the mesh on the machine's nodes: a cluster of the DOT graph and an SVG picture
chart    the cost split as SVG bar charts: time per step against the baselines, memory per device
style    what the pictures share: colours, units (ms, GiB) and SVG elements
=======  ==================================================================================================
"""

from __future__ import annotations

from unity_eq.picture.chart import cost_chart_svg
from unity_eq.picture.mesh import mesh_svg
from unity_eq.picture.page import (
    DOT_MISSING,
    FORMATS,
    INSTALL_DOT,
    Picture,
    check_format,
    default_output,
    html_page,
    write_picture,
)
from unity_eq.picture.pcg import pcg_dot, pcg_graph, placement_colours, render_svg
from unity_eq.picture.style import (
    AXIS_COLOURS,
    BACKWARD,
    COMPUTE,
    FORWARD,
    PALETTE,
    RANK_PALETTE,
    REPLICATED,
)

__all__ = [
    "AXIS_COLOURS",
    "BACKWARD",
    "COMPUTE",
    "DOT_MISSING",
    "FORMATS",
    "FORWARD",
    "INSTALL_DOT",
    "PALETTE",
    "RANK_PALETTE",
    "REPLICATED",
    "Picture",
    "check_format",
    "cost_chart_svg",
    "default_output",
    "html_page",
    "mesh_svg",
    "pcg_dot",
    "pcg_graph",
    "placement_colours",
    "render_svg",
    "write_picture",
]
