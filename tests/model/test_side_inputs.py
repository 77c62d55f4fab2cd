"""The side inputs of one small document, written out by hand, as etcmodel's input tests write theirs
(etcmodel/models/input_utils_test.py): the test is also the documentation of the layout.

The document, one long token per word, two paragraphs:

    paragraph 1: "Ann sings."  "Bob plays drums."      paragraph 2: "Cy hums."
    long token:   0    1        2    3     4                         5   6
    sentence_ids: 1    1        2    2     2                         3   3

Global tokens: 0 is CLS (sees every long token under hard g2l), 1-3 one per sentence;
global_paragraph_ids [0, 1, 1, 2] (CLS in paragraph 0, as longdoc's features place it).

Local radius r = 1: blocks of b = r + 1 = 2 long tokens, nb = 4 blocks, so the input is padded to
Lp = 8 (token 7 is padding); a query's window is [previous block | own block | next block], W = 6
keys, key column c of query p in block n being long token 2n - 2 + c. Relative ids with k = 1:
0 the same token, 1 a token to the right, 2 to the left, 3 a linked long-global pair, 4 an
unlinked one, 5 two global tokens in different paragraphs.
"""

import torch

from longdoc.model.side_inputs import StructureIds, build_side_inputs


def document(mention_ids: torch.Tensor | None = None) -> StructureIds:
    return StructureIds(
        long_mask=torch.tensor([[True] * 7]),
        global_mask=torch.tensor([[True] * 4]),
        sentence_ids=torch.tensor([[1, 1, 2, 2, 2, 3, 3]]),
        mention_ids=mention_ids,
        long_paragraph_ids=torch.tensor([[1, 1, 1, 1, 1, 2, 2]]),
        global_paragraph_ids=torch.tensor([[0, 1, 1, 2]]),
        global_sees_all=torch.tensor([[True, False, False, False]]),
    )


def side_inputs(structure: StructureIds, hard_l2g: bool = False, within_paragraph: bool = False):
    return build_side_inputs(structure, local_radius=1, max_relative_distance=1, hard_g2l=True, hard_l2g=hard_l2g,
                             local_attention_within_paragraph=within_paragraph, dtype=torch.float32)


def allowed(mask_bias: torch.Tensor) -> list:
    """The pairs a mask lets attend, as 0/1 lists (0 in the additive mask: allowed)."""
    return (mask_bias[0, 0] == 0).int().tolist()


def test_the_long_softmax_of_a_small_document():
    side = side_inputs(document())
    assert (side.block_size, side.num_blocks, side.padded_length) == (2, 4, 8)
    # [nb, b, W + G]: per block, its queries' rows; columns: window keys (previous | own | next
    # block), then the global tokens CLS, sentence 1, 2, 3 (soft l2g: every real one).
    assert allowed(side.long_mask_bias) == [
        [[0, 0, 1, 1, 0, 0, 1, 1, 1, 1],    # token 0: keys -2, -1 lie before the input; itself, 1
         [0, 0, 1, 1, 1, 0, 1, 1, 1, 1]],   # token 1: keys 0, 1, 2
        [[0, 1, 1, 1, 0, 0, 1, 1, 1, 1],    # token 2 (window: tokens 0-5): keys 1, 2, 3
         [0, 0, 1, 1, 1, 0, 1, 1, 1, 1]],   # token 3: keys 2, 3, 4
        [[0, 1, 1, 1, 0, 0, 1, 1, 1, 1],    # token 4 (window: tokens 2-7): keys 3, 4, 5
         [0, 0, 1, 1, 1, 0, 1, 1, 1, 1]],   # token 5: keys 4, 5, 6
        [[0, 1, 1, 0, 0, 0, 1, 1, 1, 1],    # token 6 (window: tokens 4-9): keys 5, 6 (7 is padding)
         [0, 0, 1, 0, 0, 0, 1, 1, 1, 1]],   # padding: a query the output drops
    ]
    assert side.long_relative_ids[0, 0].tolist() == [
        [[2, 2, 0, 1, 1, 1, 4, 3, 4, 4],    # the window's ids are the same in every block;
         [2, 2, 2, 0, 1, 1, 4, 3, 4, 4]],   # tokens 0, 1 belong to sentence 1 (3: linked)
        [[2, 2, 0, 1, 1, 1, 4, 4, 3, 4],
         [2, 2, 2, 0, 1, 1, 4, 4, 3, 4]],
        [[2, 2, 0, 1, 1, 1, 4, 4, 3, 4],
         [2, 2, 2, 0, 1, 1, 4, 4, 4, 3]],   # token 5 belongs to sentence 3
        [[2, 2, 0, 1, 1, 1, 4, 4, 4, 3],
         [2, 2, 2, 0, 1, 1, 4, 4, 4, 4]],   # padding links to nothing
    ]
    # Each long token's links: its sentence's global token, then a mentioned one (none here).
    assert side.links[0].tolist() == [[1, -1], [1, -1], [2, -1], [2, -1], [2, -1], [3, -1], [3, -1], [-1, -1]]


def test_the_global_softmax_of_a_small_document():
    side = side_inputs(document())
    # [G, G + Lp]: columns: the global tokens, then long tokens 0-7. Hard g2l: a sentence token sees
    # its own long tokens; CLS sees every real one.
    assert allowed(side.global_mask_bias) == [
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0],  # CLS
        [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # sentence 1: "Ann sings."
        [1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0],  # sentence 2: "Bob plays drums."
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0],  # sentence 3: "Cy hums."
    ]
    assert side.global_relative_ids[0, 0].tolist() == [
        [0, 5, 5, 5, 4, 4, 4, 4, 4, 4, 4, 4],  # CLS: every other global token in another paragraph
        [5, 0, 1, 5, 3, 3, 4, 4, 4, 4, 4, 4],  # sentences 1 and 2 share paragraph 1: distances
        [5, 2, 0, 5, 4, 4, 3, 3, 3, 4, 4, 4],
        [5, 5, 5, 0, 4, 4, 4, 4, 4, 3, 3, 4],
    ]


def test_hard_l2g_and_local_attention_within_paragraphs():
    side = side_inputs(document(), hard_l2g=True, within_paragraph=True)
    assert allowed(side.long_mask_bias) == [
        [[0, 0, 1, 1, 0, 0, 0, 1, 0, 0],    # a long token sees its own sentence's global token only
         [0, 0, 1, 1, 1, 0, 0, 1, 0, 0]],
        [[0, 1, 1, 1, 0, 0, 0, 0, 1, 0],
         [0, 0, 1, 1, 1, 0, 0, 0, 1, 0]],
        [[0, 1, 1, 0, 0, 0, 0, 0, 1, 0],    # token 4 (paragraph 1) does not see token 5 (paragraph 2)
         [0, 0, 0, 1, 1, 0, 0, 0, 0, 1]],   # nor token 5 token 4
        [[0, 1, 1, 0, 0, 0, 0, 0, 0, 1],
         [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]],   # padding: no key at all (a uniform softmax, dropped)
    ]


def test_a_mention_is_a_second_link():
    # Token 6 ("hums") mentions sentence 1's global token (as a WikiHop candidate mention does).
    side = side_inputs(document(mention_ids=torch.tensor([[-1, -1, -1, -1, -1, -1, 1]])))
    assert side.links[0, 6].tolist() == [3, 1]
    assert side.long_relative_ids[0, 0, 3, 0, 6:].tolist() == [4, 3, 4, 3]  # linked to sentences 1 and 3
    assert allowed(side.global_mask_bias)[1] == [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0]  # sentence 1 sees token 6
