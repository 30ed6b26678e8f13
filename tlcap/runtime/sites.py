"""Named sites: places in a model, each mapping a layer to a TransformerLens hook name.

======================  ==========================================  ===================
site                    hook point                                   activation shape
======================  ==========================================  ===================
``mlp_post``            ``blocks.{l}.mlp.hook_post`` (neurons)       batch pos d_mlp
``mlp_pre``             ``blocks.{l}.mlp.hook_pre``                  batch pos d_mlp
``resid_pre/mid/post``  ``blocks.{l}.hook_resid_pre`` ...            batch pos d_model
``attn_out``            ``blocks.{l}.hook_attn_out``                 batch pos d_model
``mlp_out``             ``blocks.{l}.hook_mlp_out``                  batch pos d_model
``mlp_in``              ``blocks.{l}.hook_mlp_in`` / ``ln2.hook_in`` batch pos d_model
``attn_pattern``        ``blocks.{l}.attn.hook_pattern``             batch head q k
``attn_scores``         ``blocks.{l}.attn.hook_attn_scores``         batch head q k
``head_z``              ``blocks.{l}.attn.hook_z``                   batch pos head d_head
``head_result``         ``blocks.{l}.attn.hook_result``              batch pos head d_model
``q_input/k_input/...`` ``blocks.{l}.hook_q_input`` ...              batch pos head d_model
``attn_norm_scale``     ``blocks.{l}.ln1.hook_scale``                batch pos 1
``embed``               ``hook_embed``                               batch pos d_model
``mlp_input``           ``blocks.{l}.hook_mlp_in`` (MLP branch only) batch pos d_model
``final_in``            ``ln_final.hook_in`` (logits reader)         batch pos d_model
``final_out``           ``ln_final.hook_normalized``                 batch pos d_model
``unembed_in``          ``unembed.hook_in`` (after ``ln_final``)     batch pos d_model
======================  ==========================================  ===================

``q_input``/``k_input``/``v_input``, ``head_result`` and ``mlp_input`` only fire inside
``with model.edge_hooks():`` (:meth:`tlcap.models.Model.edge_hooks` switches the backend's
per-head / split-input hook points on). Under
grouped-query attention ``k_input``/``v_input`` have ``n_kv_heads`` entries on the head axis.

On post-norm blocks (Gemma-2) ``attn_out`` and ``mlp_out`` are the outputs of the post-norms
``ln1_post``/``ln2_post`` (what is added to the residual); ``head_result`` is before ``ln1_post``,
whose ``attn_post_norm_scale`` (``blocks.{l}.ln1_post.hook_scale``, ``batch pos 1``) is the RMS
it divides by.

For gated MLPs (Llama, SmolLM2) ``mlp_post`` is ``act(gate) * up``, the input of the down
projection; ``mlp_pre`` is the gate pre-activation.

``unembed_in`` (TransformerBridge) and ``final_out`` (TL 3.9 ``HookedTransformer``, which has no
``unembed.hook_in``) are where :meth:`tlcap.models.Model.last_logits` keeps only the last
position: everything after them acts on each position separately.
"""

from __future__ import annotations

from dataclasses import dataclass

from tlcap.errors import InvalidConfigError, UnknownNameError


@dataclass(frozen=True)
class Site:
    """A named place in the model.

    Attributes:
        name: Short name (``"mlp_post"``).
        template: Hook-name template with ``{layer}``.
        kind: ``"neuron"``, ``"resid"``, ``"head"``, ``"pattern"`` or ``"embed"``.
    """

    name: str
    template: str
    kind: str

    @property
    def per_layer(self) -> bool:
        return "{layer}" in self.template

    def hook_name(self, layer: int | None = None) -> str:
        """The TransformerLens hook name of this site at ``layer``.

        Args:
            layer: The layer index; required for a per-layer site, ignored otherwise.

        Returns:
            The hook name, e.g. ``"blocks.3.mlp.hook_post"`` (the template itself for a site with no layer).

        Raises:
            InvalidConfigError: the site is per-layer and ``layer`` is ``None``.
        """
        if self.per_layer:
            if layer is None:
                raise InvalidConfigError(f"site {self.name!r} needs a layer")
            return self.template.format(layer=layer)
        return self.template


SITES: dict[str, Site] = {
    s.name: s
    for s in [
        Site("mlp_post", "blocks.{layer}.mlp.hook_post", "neuron"),
        Site("mlp_pre", "blocks.{layer}.mlp.hook_pre", "neuron"),
        Site("resid_pre", "blocks.{layer}.hook_resid_pre", "resid"),
        Site("resid_mid", "blocks.{layer}.hook_resid_mid", "resid"),
        Site("resid_post", "blocks.{layer}.hook_resid_post", "resid"),
        Site("attn_out", "blocks.{layer}.hook_attn_out", "resid"),
        Site("mlp_out", "blocks.{layer}.hook_mlp_out", "resid"),
        Site("mlp_in", "blocks.{layer}.ln2.hook_in", "resid"),
        Site("attn_in", "blocks.{layer}.ln1.hook_in", "resid"),
        Site("attn_pattern", "blocks.{layer}.attn.hook_pattern", "pattern"),
        Site("attn_scores", "blocks.{layer}.attn.hook_attn_scores", "pattern"),
        Site("head_z", "blocks.{layer}.attn.hook_z", "head"),
        Site("head_result", "blocks.{layer}.attn.hook_result", "head"),
        Site("q_input", "blocks.{layer}.hook_q_input", "head"),
        Site("q", "blocks.{layer}.attn.hook_q", "head"),
        Site("k", "blocks.{layer}.attn.hook_k", "head"),
        Site("v", "blocks.{layer}.attn.hook_v", "head"),
        Site("attn_norm_scale", "blocks.{layer}.ln1.hook_scale", "resid"),
        Site("attn_post_norm_scale", "blocks.{layer}.ln1_post.hook_scale", "resid"),
        Site("k_input", "blocks.{layer}.hook_k_input", "head"),
        Site("v_input", "blocks.{layer}.hook_v_input", "head"),
        Site("embed", "hook_embed", "embed"),
        Site("mlp_input", "blocks.{layer}.hook_mlp_in", "resid"),
        Site("final_in", "ln_final.hook_in", "embed"),
        Site("final_out", "ln_final.hook_normalized", "embed"),
        Site("unembed_in", "unembed.hook_in", "embed"),
    ]
}


def get_site(name: str, option: str | None = "--site") -> Site:
    """Look up a site by name.

    Args:
        name: A key of :data:`SITES`.
        option: CLI spelling named in the error message (``None`` for none).

    Returns:
        The :class:`Site` of that name.

    Raises:
        UnknownNameError: ``name`` is not a site (the message lists the known ones).
    """
    try:
        return SITES[name]
    except KeyError:
        raise UnknownNameError.of("site", name, SITES, option=option) from None
