#!/usr/bin/env python3
"""`simdattn mha --model` and `--family diffusers` on tiny checkpoints of every supported family
(model_families.py: config.json and safetensors with the published tensor names, shapes and
dtypes) against each family's attention sub-layer in float64, on every backend; and the exit
code and one-line error for broken model directories. Qwen3-Next (qwen3_next_model.py): its full
attention through `simdattn mha --model`, its Gated DeltaNet layers and the gated delta rule on
files through `simdattn linear --rule gated-delta`.

    python3 test_models.py path/to/simdattn [unittest args]
"""
import json
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoints"))
import mha_weights  # noqa: E402
import model_families as mf  # noqa: E402
import qwen3_next_model as q3n  # noqa: E402
import cli_case  # noqa: E402  (CliCase: a temporary directory, .npy files, the CLI run; backends())

backends = cli_case.backends


# Tolerance on max |y - want| / max(1, max |want|): the layer's dtype against float64.
TOL = {"F32": 1e-4, "F16": 1e-4, "BF16": 4e-2}


class Models(cli_case.CliCase):
    def setUp(self):
        super().setUp()
        self.rng = np.random.default_rng(20261201)

    def mha(self, *args, rc=0):
        r = self.run_cli("mha", "--out", self.path("y.npy"), *args)
        self.assertEqual(r.returncode, rc, r.stderr)
        if rc != 0:
            self.assertEqual(r.stderr.count("\n"), 1, r.stderr)  # one line
            self.assertFalse(os.path.exists(self.path("y.npy")))
            return r.stderr
        return np.load(self.path("y.npy"))

    def check(self, y, want, dtype, what):
        err = np.abs(y - want).max() / max(1.0, np.abs(want).max())
        self.assertLess(err, TOL[dtype], what)

    def model(self, family, **kw):
        d = self.path(family)
        W = mf.write_checkpoint(d, family, self.rng, **kw)
        return d, W

    def test_every_family_self_attention_every_backend_with_padding(self):
        for family, spec in mf.FAMILIES.items():
            d, W = self.model(family, weight_scale=2.0)
            cfg = spec["config"]
            dm = mf.dims(cfg)[0]
            B, S = 2, 7
            x = self.rng.standard_normal((B, S, dm)).astype(np.float32)
            decoder = family in mf.DECODERS
            pad = np.zeros((B, S), bool)
            positions = None
            if decoder:  # left padding, positions counted from the first real token
                pad[1, :2] = True
                positions = np.maximum(np.cumsum(~pad, axis=1) - 1, 0).astype(np.int64)
            else:
                pad[1, 5:] = True
            extra = ["--key-padding-mask", self.save("pad.npy", pad)]
            if positions is not None:
                extra += ["--positions", self.save("pos.npy", positions)]
            rnd = mha_weights.to_bf16 if spec["dtype"] == "BF16" else None
            xin = mha_weights.to_bf16(x) if rnd else x
            stacks = ["encoder", "decoder"] if family == "t5" else [None]
            for layer in (0, 1):
                for stack in stacks:
                    s_args = ["--stack", stack] if stack else []
                    causal_stack = decoder or stack == "decoder"
                    want = mf.reference(family, cfg, W, layer, xin, pad=pad, positions=positions,
                                        stack=stack or "encoder", rnd=rnd)
                    rows = ~pad[:, :, None] if causal_stack else np.ones((B, S, 1), bool)  # pad queries: no row
                    for backend in backends():
                        if spec["dtype"].lower() not in cli_case.backend_dtypes(backend):
                            continue  # oneDNN without a bf16 matmul on this CPU
                        what = f"{family} layer {layer} {stack or ''} {backend}"
                        y = self.mha("--model", d, "--layer", str(layer), *s_args, "--query", self.save("x.npy", x),
                                     "--backend", backend, "--threads", "2", *extra)
                        self.assertEqual(y.dtype, np.float32)
                        self.check(np.where(rows, y, 0), np.where(rows, want, 0), spec["dtype"], what)

    def test_t5_cross_attention_and_diffusers_blocks(self):
        d, W = self.model("t5")
        cfg = mf.FAMILIES["t5"]["config"]
        x = self.rng.standard_normal((2, 5, 32)).astype(np.float32)
        enc = self.rng.standard_normal((2, 9, 32)).astype(np.float32)
        pad = np.zeros((2, 9), bool)
        pad[0, 7:] = True
        for backend in backends():
            y = self.mha("--model", d, "--layer", "1", "--stack", "decoder", "--attention", "cross", "--query",
                         self.save("x.npy", x), "--key", self.save("k.npy", enc), "--value", self.save("v.npy", enc),
                         "--key-padding-mask", self.save("pad.npy", pad), "--backend", backend)
            want = mf.reference("t5", cfg, W, 1, x, enc=enc, pad=pad, stack="decoder", attention="cross")
            self.check(y, want, "F32", "t5 cross " + backend)
        path = self.path("unet.safetensors")
        W = mf.write_diffusers(path, self.rng, qkv_bias=True)
        x = self.rng.standard_normal((2, 16, 32)).astype(np.float32)
        ctx = self.rng.standard_normal((2, 6, 24)).astype(np.float32)
        for backend in backends():
            y = self.mha("--weights", path, "--family", "diffusers", "--prefix", mf.DIFFUSERS_PREFIX, "--heads", "4",
                         "--query", self.save("x.npy", x), "--backend", backend)
            self.check(y, mf.diffusers_reference(W, x), "F16", "attn1 " + backend)
            y = self.mha("--weights", path, "--family", "diffusers", "--prefix", mf.DIFFUSERS_PREFIX.rstrip("."),
                         "--heads", "4", "--attention", "cross", "--query", self.save("x.npy", x),
                         "--key", self.save("c.npy", ctx), "--value", self.save("c.npy", ctx), "--backend", backend)
            self.check(y, mf.diffusers_reference(W, x, enc=ctx, attention="cross"), "F16", "attn2 " + backend)

    def test_diffusers_prefix_naming_the_sub_layer(self):
        """A --prefix as the tensor names spell it (...attn1 / ...attn2, with or without a final '.')
        selects that sub-layer; --attention agreeing with it is accepted, contradicting it is one
        line naming both flags."""
        path = self.path("unet.safetensors")
        W = mf.write_diffusers(path, self.rng)
        x = self.rng.standard_normal((1, 8, 32)).astype(np.float32)
        ctx = self.rng.standard_normal((1, 5, 24)).astype(np.float32)
        block = mf.DIFFUSERS_PREFIX.rstrip(".")
        common = ["--weights", path, "--family", "diffusers", "--heads", "4", "--query", self.save("x.npy", x)]
        kv = ["--key", self.save("c.npy", ctx), "--value", self.save("c.npy", ctx)]
        for prefix in (block + ".attn2", block + ".attn2."):
            for attention in ([], ["--attention", "cross"]):
                y = self.mha(*common, "--prefix", prefix, *attention, *kv)
                self.check(y, mf.diffusers_reference(W, x, enc=ctx, attention="cross"), "F16", prefix)
        for attention in ([], ["--attention", "self"]):
            y = self.mha(*common, "--prefix", block + ".attn1", *attention)
            self.check(y, mf.diffusers_reference(W, x), "F16", "attn1")
        os.remove(self.path("y.npy"))  # a refused call writes none
        err = self.mha(*common, "--prefix", block + ".attn2", "--attention", "self", *kv, rc=2)
        self.assertIn("--attention: self contradicts --prefix " + block + ".attn2, which names attn2", err)
        err = self.mha(*common, "--prefix", block + ".attn1", "--attention", "cross", *kv, rc=2)
        self.assertIn("--attention: cross contradicts --prefix " + block + ".attn1", err)
        # attn2 needs the encoder's output, as --attention cross does
        err = self.mha(*common, "--prefix", block + ".attn2", rc=2)
        self.assertIn("--key: cross-attention needs --key and --value", err)

    def test_single_file_before_index(self):
        """A directory holding both model.safetensors and a sharded index is read from the single
        file, as Hugging Face's loaders read it."""
        d = self.path("both")
        mf.write_checkpoint(d, "llama", self.rng)  # shards + index
        single = self.path("single")
        mf.FAMILIES["llama"]["shards"] = 1
        try:
            W = mf.write_checkpoint(single, "llama", self.rng)  # other weights, one file
        finally:
            mf.FAMILIES["llama"]["shards"] = 2
        os.rename(os.path.join(single, "model.safetensors"), os.path.join(d, "model.safetensors"))
        x = self.rng.standard_normal((1, 5, 32)).astype(np.float32)
        y = self.mha("--model", d, "--layer", "1", "--query", self.save("x.npy", x))
        want = mf.reference("llama", mf.FAMILIES["llama"]["config"], W, 1, mha_weights.to_bf16(x), rnd=mha_weights.to_bf16)
        self.check(y, want, "BF16", "single file")

    def test_float64_query_computes_in_float64(self):
        """An F32 checkpoint on a float64 query runs an f64 layer: agreement to rounding."""
        d, W = self.model("gemma2")
        cfg = mf.FAMILIES["gemma2"]["config"]
        x = self.rng.standard_normal((1, 9, 32))
        for layer in (0, 1):
            y = self.mha("--model", d, "--layer", str(layer), "--query", self.save("x.npy", x))
            self.assertEqual(y.dtype, np.float64)
            want = mf.reference("gemma2", cfg, W, layer, x)
            self.assertLess(np.abs(y - want).max(), 1e-10)

    def test_broken_model_directories_exit_2_naming_the_fault(self):
        x = self.save("x.npy", self.rng.standard_normal((1, 4, 32)).astype(np.float32))
        d, _ = self.model("llama")  # sharded
        shards = sorted(f for f in os.listdir(d) if f.startswith("model-"))
        cases = []
        # a missing shard
        missing = self.path("missing")
        mf.write_checkpoint(missing, "llama", self.rng)
        os.remove(os.path.join(missing, shards[1]))
        cases.append((["--model", missing, "--layer", "0"], shards[1]))
        # a truncated shard
        trunc = self.path("trunc")
        mf.write_checkpoint(trunc, "llama", self.rng)
        p = os.path.join(trunc, shards[0])
        with open(p, "r+b") as f:
            f.truncate(os.path.getsize(p) - 10)
        cases.append((["--model", trunc, "--layer", "0"], shards[0]))
        # no weights at all
        empty = self.path("empty")
        os.makedirs(empty)
        with open(os.path.join(empty, "config.json"), "w") as f:
            json.dump(mf.FAMILIES["bert"]["config"], f)
        cases.append((["--model", empty, "--layer", "0"], "model.safetensors"))
        # no config.json
        cases.append((["--model", self.path("nowhere"), "--layer", "0"], "config.json"))
        # a config without a key the family needs
        nokey = self.path("nokey")
        mf.write_checkpoint(nokey, "bert", self.rng, config_edit=lambda c: c.pop("num_attention_heads"))
        cases.append((["--model", nokey, "--layer", "0"], "num_attention_heads"))
        # an unknown model_type, an unsupported rope scaling
        unknown = self.path("unknown")
        mf.write_checkpoint(unknown, "bert", self.rng, config_edit=lambda c: c.update(model_type="mamba"))
        cases.append((["--model", unknown, "--layer", "0"], "mamba"))
        dynamic = self.path("dynamic")
        mf.write_checkpoint(dynamic, "mistral", self.rng,
                            config_edit=lambda c: c.update(rope_scaling={"rope_type": "dynamic", "factor": 4.0}))
        cases.append((["--model", dynamic, "--layer", "0"], "dynamic"))
        yarn = self.path("yarn")
        mf.write_checkpoint(yarn, "gpt_oss", self.rng,
                            config_edit=lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": -2}))
        cases.append((["--model", yarn, "--layer", "0"], "beta_fast"))
        # an MLA config whose sizes disagree with the tensors: the tensor named; an odd rope width
        mla = self.path("mla")
        mf.write_checkpoint(mla, "deepseek_v3", self.rng, config_edit=lambda c: c.update(kv_lora_rank=11))
        cases.append((["--model", mla, "--layer", "0"], "kv_a_proj_with_mqa.weight"))
        nokv = self.path("nokv")
        mf.write_checkpoint(nokv, "deepseek_v3", self.rng, config_edit=lambda c: c.pop("kv_lora_rank"))
        cases.append((["--model", nokv, "--layer", "0"], "kv_lora_rank"))
        odd = self.path("odd")
        mf.write_checkpoint(odd, "deepseek_v2", self.rng, config_edit=lambda c: c.update(qk_rope_head_dim=3))
        cases.append((["--model", odd, "--layer", "0"], "qk_rope_head_dim"))
        types = self.path("types")
        mf.write_checkpoint(types, "gpt_oss", self.rng, config_edit=lambda c: c.update(layer_types=["sliding_attention", "local"]))
        cases.append((["--model", types, "--layer", "1"], "layer_types"))
        # sizes no model has (their products would overflow), a non-positive scalar
        huge = self.path("huge")
        mf.write_checkpoint(huge, "llama", self.rng, config_edit=lambda c: c.update(hidden_size=2 ** 62))
        cases.append((["--model", huge, "--layer", "0"], "hidden_size"))
        scalar = self.path("scalar")
        mf.write_checkpoint(scalar, "gemma2", self.rng, config_edit=lambda c: c.update(query_pre_attn_scalar=0))
        cases.append((["--model", scalar, "--layer", "0"], "query_pre_attn_scalar"))
        # BERT's relative position scores are not the layer's
        relpos = self.path("relpos")
        mf.write_checkpoint(relpos, "bert", self.rng, config_edit=lambda c: c.update(position_embedding_type="relative_key"))
        cases.append((["--model", relpos, "--layer", "0"], "position_embedding_type"))
        # a value nested deeper than a recursive reader's stack, a FIFO for config.json
        deep = self.path("deep")
        mf.write_checkpoint(deep, "bert", self.rng)
        with open(os.path.join(deep, "config.json")) as f:
            text = f.read().replace('"hidden_size": 32', '"hidden_size": ' + "[" * 100000 + "]" * 100000)
        with open(os.path.join(deep, "config.json"), "w") as f:
            f.write(text)
        cases.append((["--model", deep, "--layer", "0"], "hidden_size"))
        fifo = self.path("fifo")
        os.makedirs(fifo)
        os.mkfifo(os.path.join(fifo, "config.json"))
        cases.append((["--model", fifo, "--layer", "0"], "not a regular file"))
        # a tensor of the wrong shape
        shape = self.path("shape")
        mf.write_checkpoint(shape, "qwen2", self.rng, config_edit=lambda c: c.update(num_key_value_heads=4))
        cases.append((["--model", shape, "--layer", "0"], "layers.0.self_attn.k_proj.weight"))
        # a layer past the last, a stack the family lacks
        cases.append((["--model", d, "--layer", "2"], "--layer"))
        cases.append((["--model", d, "--layer", "0", "--stack", "decoder"], "--stack"))
        # an index naming a file outside the directory
        evil = self.path("evil")
        mf.write_checkpoint(evil, "llama", self.rng)
        idx = os.path.join(evil, "model.safetensors.index.json")
        with open(idx) as f:
            j = json.load(f)
        j["weight_map"]["model.layers.0.self_attn.q_proj.weight"] = "../x.npy"
        with open(idx, "w") as f:
            json.dump(j, f)
        cases.append((["--model", evil, "--layer", "0"], "../x.npy"))
        for args, named in cases:
            err = self.mha(*args, "--query", x, rc=2)
            self.assertIn(named, err, args)
        # flags the config sets are refused with --model
        err = self.mha("--model", d, "--layer", "0", "--query", x, "--rope-theta", "10", rc=2)
        self.assertIn("--rope-theta", err)


class Qwen3Next(cli_case.CliCase):
    def setUp(self):
        super().setUp()
        self.rng = np.random.default_rng(20261206)
        self.d = self.path("q3n")
        self.cfg, self.W = q3n.write_checkpoint(self.d, self.rng)

    def cli(self, *args, rc=0):
        if os.path.exists(self.path("y.npy")):
            os.remove(self.path("y.npy"))
        r = self.run_cli(*args, "--out", self.path("y.npy"))
        self.assertEqual(r.returncode, rc, r.stderr)
        if rc != 0:
            self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
            self.assertFalse(os.path.exists(self.path("y.npy")))
            return r.stderr
        return np.load(self.path("y.npy"))

    def test_full_attention_layer(self):
        layer = q3n.full_layers(self.cfg)[0]
        x = self.rng.standard_normal((2, 6, 32)).astype(np.float32)
        want = q3n.attention_reference(self.cfg, self.W, layer, x)
        for backend in backends():
            y = self.cli("mha", "--model", self.d, "--layer", str(layer), "--query", self.save("x.npy", x),
                         "--backend", backend)
            self.assertLess(np.abs(y - want).max() / np.abs(want).max(), 1e-4, backend)

    def test_gated_deltanet_layer(self):
        layer = q3n.linear_layers(self.cfg)[1]
        x = self.rng.standard_normal((2, 70, 32)).astype(np.float32)
        want, _ = q3n.gated_deltanet_reference(self.cfg, self.W, layer, x)
        y = self.cli("linear", "--rule", "gated-delta", "--model", self.d, "--layer", str(layer), "--x", self.save("x.npy", x),
                     "--threads", "2")
        self.assertEqual(y.dtype, np.float32)
        self.assertLess(np.abs(y - want).max() / np.abs(want).max(), 1e-4)
        err = self.cli("linear", "--rule", "gated-delta", "--model", self.d, "--layer", "3", "--x", self.path("x.npy"), rc=2)
        self.assertIn("--layer", err)
        err = self.cli("linear", "--rule", "gated-delta", "--model", self.d, "--layer", "0",
                       "--x", self.save("bad.npy", np.ones((2, 3, 31), np.float32)), rc=2)
        self.assertIn("--x", err)
        err = self.cli("mha", "--model", self.d, "--layer", "0", "--query", self.path("x.npy"), rc=2)
        self.assertIn("linear_attention", err)

    def test_rule_on_files(self):
        B, T, H, Hv, Dk, Dv = 2, 75, 2, 4, 8, 6
        q, k = (self.rng.standard_normal((B, T, H, Dk)) for _ in range(2))
        v = self.rng.standard_normal((B, T, Hv, Dv))
        g = -self.rng.uniform(0, 0.3, (B, T, Hv))
        beta = self.rng.uniform(0, 1, (B, T, Hv))
        s0 = self.rng.standard_normal((B, Hv, Dk, Dv))
        rep = Hv // H
        # (the reference normalizes q and k and scales q itself)
        want, want_s = q3n.recurrent_gated_delta_rule(np.repeat(q, rep, axis=2), np.repeat(k, rep, axis=2), v, g, beta,
                                                      state=s0)
        files = [self.save(n + ".npy", a) for n, a in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("s0", s0))]
        y = self.cli("linear", "--rule", "gated-delta", "--q", files[0], "--k", files[1], "--v", files[2], "--g", files[3],
                     "--beta", files[4], "--initial-state", files[5], "--final-state", self.path("s.npy"), "--qk-l2norm")
        self.assertEqual(y.dtype, np.float64)  # the files' dtype (computed in f32)
        self.assertLess(np.abs(y - want).max() / np.abs(want).max(), 1e-4)
        s = np.load(self.path("s.npy"))
        self.assertLess(np.abs(s - want_s).max() / np.abs(want_s).max(), 1e-4)
        g[1, 3, 2] = 0.5
        err = self.cli("linear", "--rule", "gated-delta", "--q", files[0], "--k", files[1], "--v", files[2],
                       "--g", self.save("gbad.npy", g), "--beta", files[4], rc=2)
        self.assertIn("--g", err)
        err = self.cli("linear", "--rule", "gated-delta", "--q", files[0], "--k", files[1], "--v", files[2], rc=2)
        self.assertIn("--g", err)
        err = self.cli("linear", "--rule", "delta", "--q", files[0], "--k", files[1], "--v", files[2], rc=2)
        self.assertIn("--rule", err)


if __name__ == "__main__":
    cli_case.BIN = os.path.abspath(sys.argv.pop(1))
    unittest.main()
