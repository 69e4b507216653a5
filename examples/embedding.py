"""An embedding bag (a gather) and its backward (a scatter-add), each one definition.

Every id is checked at run time: one out of range raises tclang.TCIndexError instead of
reading (or writing) outside the table. The backward, `dTable(Ids(b, l), d) +=! dO(b, d)`,
takes time proportional to the lookups, not to the table; it is also what `tc.grad` of
the bag writes. Compared with PyTorch's embedding_bag backward where PyTorch is installed,
else with NumPy's `np.add.at`."""

import numpy as np

import tclang as tc
from _check import check, timed

SOURCE = """
def bag(float(E, D) Table, int32(B, L) Ids) -> (O) { O(b, d) +=! Table(Ids(b, l), d) }
def bag_backward(float(E, D) Table, int32(B, L) Ids, float(B, D) dO) -> (float(E, D) dTable) {
    dTable(Ids(b, l), d) +=! dO(b, d)
}
"""


def numpy_backward(table, ids, grad):
    out = np.zeros_like(table)
    np.add.at(out, ids, np.broadcast_to(grad[:, None, :], ids.shape + grad.shape[1:]))
    return out


def torch_backward(table, ids, grad):
    """PyTorch's own: the gradient of embedding_bag(mode="sum") with respect to the table."""
    import torch
    weight = torch.from_numpy(table).requires_grad_()
    out = torch.nn.functional.embedding_bag(torch.from_numpy(ids).long(), weight, mode="sum")
    out.backward(torch.from_numpy(grad))
    return weight.grad.numpy()


def torch_index_add(table, ids, grad):
    """The same backward as PyTorch code writes it, its inputs made beforehand."""
    import torch
    flat = torch.from_numpy(ids).long().flatten()
    rows = torch.from_numpy(grad).repeat_interleave(ids.shape[1], dim=0)
    return lambda: torch.zeros(table.shape).index_add_(0, flat, rows)


def main(rows: int = 50_000, width: int = 64, bags: int = 257, per_bag: int = 13) -> None:
    rng = np.random.default_rng(0)
    table = rng.standard_normal((rows, width), np.float32)
    ids = rng.integers(0, rows, (bags, per_bag)).astype(np.int32)
    module = tc.define(SOURCE)
    check("embedding bag", module.bag(table, ids), table[ids].sum(axis=1))
    grad = rng.standard_normal((bags, width), np.float32)
    ours = module.bag_backward(table, ids, grad)
    check("embedding bag backward", ours, numpy_backward(table, ids, grad))
    try:
        expected = torch_backward(table, ids, grad)
    except ImportError:
        expected = None
    if expected is not None:
        np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)
        print("embedding bag backward: matches PyTorch")
        other = f", PyTorch index_add_ {timed(torch_index_add(table, ids, grad)) * 1e3:.2f} ms"
    else:
        other = ""
    print(f"  backward of {bags}x{per_bag} lookups into a {rows}x{width} table: tclang "
          f"{timed(module.bag_backward, table, ids, grad) * 1e3:.2f} ms, np.add.at "
          f"{timed(numpy_backward, table, ids, grad) * 1e3:.2f} ms{other}")
    g = tc.grad(module.bag, wrt="Table")
    assert "dTable(Ids(b, l), d) += dO(b, d)" in g.source, g.source
    ids[2, 3] = rows
    try:
        module.bag(table, ids)
    except tc.TCIndexError as err:
        print(f"an id out of range is caught: {err}")


if __name__ == "__main__":
    main()
