#!/usr/bin/env python3
"""Generate sentence-transformers reference embeddings for all-MiniLM-L6-v2.

Usage: python3 make_reference.py MODEL_DIR OUT_DIR

Writes OUT_DIR/minilm_sentences.json and OUT_DIR/minilm_st_reference.json.
The embeddings are exactly what `SentenceTransformer(MODEL_DIR, device="cpu")
.encode(sentences)` returns with the model's default pipeline (modules.json),
cast to float32 and rounded to 7 significant digits.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
import sentence_transformers
from sentence_transformers import SentenceTransformer

SENTENCES = [
    # --- short (1-3 words) ---
    "Hello",
    "Good morning!",
    "cat",
    "Rust compiler",
    "42",
    "OK?",
    "Bonjour le monde",
    "Danke schön",
    "你好",
    "ありがとう",
    "Привет",
    "مرحبا",
    "🚀🔥",
    "HELLO world",
    "   spaced   out   ",
    # --- medium ---
    "The quick brown fox jumps over the lazy dog.",
    "Machine learning models convert text into dense vectors.",
    "I bought 3 apples, 12 oranges and 1.5 kg of grapes for $7.99.",
    "What time does the train to Berlin leave tomorrow?",
    "The meeting was moved from 10:30 AM to 2:15 PM on 2024-03-18.",
    "fn main() { println!(\"Hello, world!\"); }",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name;",
    "def add(a, b):\n    return a + b",
    "Le chat dort sur le canapé pendant que la pluie tombe.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "¿Dónde está la biblioteca más cercana, por favor?",
    "今天天气很好，我们去公园散步吧。",
    "東京は日本の首都で、人口がとても多いです。",
    "Москва — столица России и крупнейший город страны.",
    "اللغة العربية جميلة وغنية بالمفردات.",
    "Crème brûlée, façade, naïve, résumé, São Paulo, Zürich, Øresund.",
    "I love this movie!!! 😍😍 Best. Film. Ever.",
    "tHiS sEnTeNcE hAs WeIrD cApItAlIzAtIoN.",
    "Tabs\tand\nnewlines   and    multiple     spaces.",
    "Email me at someone@example.com or visit https://example.org/path?q=1.",
    "The ratio is 3:1, i.e. 75% vs. 25% (approximately).",
    "A stitch in time saves nine.",
    "Embeddings capture semantic similarity between sentences.",
    "The weather is lovely today.",
    "It is sunny and warm outside this afternoon.",
    "Stock prices fell sharply after the earnings report.",
    "Version 2.0.1-beta fixes bug #1234 and improves performance by ~15%.",
    "x = [1, 2, 3]; y = {k: v for k, v in zip('abc', x)}",
    "“Smart quotes” — em dashes – en dashes … and ellipses.",
    "Ελληνικά: Η γλώσσα είναι όμορφη.",
    # --- long (60-120 words) ---
    "It was the best of times, it was the worst of times, it was the age of wisdom, "
    "it was the age of foolishness, it was the epoch of belief, it was the epoch of "
    "incredulity, it was the season of Light, it was the season of Darkness, it was "
    "the spring of hope, it was the winter of despair, we had everything before us, "
    "we had nothing before us, we were all going direct to Heaven, we were all going "
    "direct the other way.",
    "Sentence embedding models map a piece of text to a fixed-size vector so that "
    "texts with similar meanings end up close to each other in the vector space. "
    "They are commonly used for semantic search, clustering, duplicate detection and "
    "retrieval-augmented generation. A typical pipeline tokenizes the input, runs a "
    "transformer encoder over the tokens, averages the token representations using "
    "the attention mask, and finally normalizes the result to unit length so that a "
    "dot product equals the cosine similarity.",
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or "
    "no money in my purse, and nothing particular to interest me on shore, I thought "
    "I would sail about a little and see the watery part of the world. It is a way I "
    "have of driving off the spleen and regulating the circulation. Whenever I find "
    "myself growing grim about the mouth, it is high time to get to sea as soon as I can.",
    "The quarterly report showed revenue of 4.2 million dollars, up 18% from the "
    "previous quarter, while operating costs rose only 6%. The board approved a "
    "dividend of 0.35 per share, payable on 15 July 2024, and announced plans to open "
    "three new offices in Lisbon, Warsaw and Singapore. Analysts expect growth to "
    "continue through 2025, although currency fluctuations and rising interest rates "
    "remain significant risks for the company and its competitors.",
    "Il était une fois, dans un petit village au bord de la mer, une vieille femme "
    "qui vivait seule avec son chat. Chaque matin, elle descendait au port pour "
    "acheter du poisson frais, et chaque soir, elle racontait aux enfants du village "
    "des histoires de marins, de tempêtes et de trésors cachés. Personne ne savait "
    "d'où elle venait, mais tout le monde l'aimait beaucoup.",
    "Als Gregor Samsa eines Morgens aus unruhigen Träumen erwachte, fand er sich in "
    "seinem Bett zu einem ungeheueren Ungeziefer verwandelt. Er lag auf seinem "
    "panzerartig harten Rücken und sah, wenn er den Kopf ein wenig hob, seinen "
    "gewölbten, braunen, von bogenförmigen Versteifungen geteilten Bauch, auf dessen "
    "Höhe sich die Bettdecke, zum gänzlichen Niedergleiten bereit, kaum noch erhalten "
    "konnte. Seine vielen, im Vergleich zu seinem sonstigen Umfang kläglich dünnen "
    "Beine flimmerten ihm hilflos vor den Augen.",
    "En un lugar de la Mancha, de cuyo nombre no quiero acordarme, no ha mucho tiempo "
    "que vivía un hidalgo de los de lanza en astillero, adarga antigua, rocín flaco y "
    "galgo corredor. Una olla de algo más vaca que carnero, salpicón las más noches, "
    "duelos y quebrantos los sábados, lentejas los viernes, algún palomino de "
    "añadidura los domingos, consumían las tres partes de su hacienda.",
    "To build the project, first install the Rust toolchain with rustup, then run "
    "`cargo build --release` in the repository root. The binary will be placed in "
    "target/release/. If you see an error like \"linker `cc` not found\", install a C "
    "compiler (for example `apt-get install build-essential` on Debian or Ubuntu). "
    "Tests can be run with `cargo test`; set RUST_LOG=debug to see verbose logging "
    "output while they execute.",
    "Yesterday we hiked for nearly eleven hours 🥾⛰️ — starting at 5:40 in the morning, "
    "climbing 1,850 meters, and reaching the summit just before noon!!! The view was "
    "INCREDIBLE: glaciers, lakes, and clouds drifting below us. On the way down it "
    "started raining 🌧️, my boots got soaked, and we slipped twice on the wet rocks. "
    "Still, totally worth it. Would I do it again? Absolutely... but maybe with better "
    "shoes next time 😅.",
    "Photosynthesis is the process by which green plants, algae and some bacteria "
    "convert light energy into chemical energy. Using sunlight, water and carbon "
    "dioxide, they produce glucose and release oxygen as a by-product. The process "
    "takes place mainly in the chloroplasts, where the pigment chlorophyll absorbs "
    "light, most strongly in the blue and red parts of the spectrum, which is why "
    "leaves usually look green to the human eye.",
    "In the beginning God created the heaven and the earth. And the earth was without "
    "form, and void; and darkness was upon the face of the deep. And the Spirit of God "
    "moved upon the face of the waters. And God said, Let there be light: and there "
    "was light. And God saw the light, that it was good: and God divided the light "
    "from the darkness.",
    "Les   espaces   multiples,\tles tabulations et les retours à la ligne\n"
    "ne devraient pas changer le sens de cette phrase, qui parle simplement d'un "
    "modèle de langage capable de comprendre des textes écrits en français, en "
    "anglais ou en allemand, même lorsque la mise en forme est irrégulière ou que la "
    "ponctuation est étrange ; l'important, c'est que le vecteur final reste stable "
    "et reproductible d'une exécution à l'autre.",
    "The old lighthouse keeper climbed the spiral staircase every evening at dusk, "
    "counting the one hundred and twelve steps under his breath. At the top he "
    "trimmed the wick, polished the great lens until it gleamed, and watched the "
    "first beam sweep across the dark water. Ships he would never see relied on that "
    "light, and he found a quiet satisfaction in knowing that his small, repetitive "
    "work kept strangers safe through the night.",
    "A hash map stores key-value pairs and offers average constant-time lookup, "
    "insertion and deletion. Internally it computes a hash of each key, reduces it to "
    "a bucket index, and resolves collisions either by chaining entries in a list or "
    "by open addressing. When the load factor exceeds a threshold, the table is "
    "resized, typically doubling its capacity, and every entry is rehashed into the "
    "new, larger array of buckets.",
    "Four score and seven years ago our fathers brought forth on this continent, a new "
    "nation, conceived in Liberty, and dedicated to the proposition that all men are "
    "created equal. Now we are engaged in a great civil war, testing whether that "
    "nation, or any nation so conceived and so dedicated, can long endure. We are met "
    "on a great battle-field of that war.",
]

assert len(SENTENCES) == 60, len(SENTENCES)


def round_sig(x, sig=7):
    x = float(x)
    if x == 0.0 or not math.isfinite(x):
        return x
    return float(f"{x:.{sig - 1}e}")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)

    with open(os.path.join(model_dir, "modules.json")) as f:
        modules = json.load(f)
    pipeline = [m["type"].rsplit(".", 1)[-1] for m in modules]
    normalized = "Normalize" in pipeline

    model = SentenceTransformer(model_dir, device="cpu")
    model.eval()
    print("model:", model)
    print("max_seq_length:", model.max_seq_length)

    # Token counts (with special tokens), no truncation, to verify nothing is truncated.
    tok = model.tokenizer
    n_tokens = [len(tok(s, add_special_tokens=True)["input_ids"]) for s in SENTENCES]
    assert max(n_tokens) <= model.max_seq_length, (max(n_tokens), model.max_seq_length)

    # Default pipeline output (includes Normalize for all-MiniLM-L6-v2).
    emb = model.encode(SENTENCES, convert_to_numpy=True).astype(np.float32)
    # NOTE: normalize_embeddings=False does NOT remove the pipeline's own Normalize
    # module; it only skips the *extra* normalization encode() can add. So this
    # equals the default output for all-MiniLM-L6-v2.
    emb_nf = model.encode(SENTENCES, normalize_embeddings=False, convert_to_numpy=True).astype(np.float32)
    assert np.allclose(emb, emb_nf, atol=1e-7)
    # True pre-normalize output: run only Transformer -> Pooling(mean).
    n_pre = len(pipeline) - 1 if normalized else len(pipeline)
    pre_model = SentenceTransformer(modules=[model[i] for i in range(n_pre)], device="cpu")
    emb_raw = pre_model.encode(SENTENCES, convert_to_numpy=True).astype(np.float32)
    assert emb.shape == (60, 384), emb.shape

    raw_norms = np.linalg.norm(emb_raw, axis=1)
    out_norms = np.linalg.norm(emb, axis=1)
    print("pre-normalize (Transformer->Pooling) norms: min %.4f max %.4f" % (raw_norms.min(), raw_norms.max()))
    print("default-output norms:      min %.6f max %.6f" % (out_norms.min(), out_norms.max()))
    if normalized:
        assert np.allclose(out_norms, 1.0, atol=1e-5)
        assert np.allclose(emb, emb_raw / raw_norms[:, None], atol=1e-6)

    # Sanity check: encode the first sentence again; cosine with itself == 1.
    again = model.encode([SENTENCES[0]], convert_to_numpy=True).astype(np.float32)[0]
    cos = float(np.dot(emb[0], again) / (np.linalg.norm(emb[0]) * np.linalg.norm(again)))
    print("cosine(first vector, re-encoded first vector) = %.7f" % cos)
    assert abs(cos - 1.0) < 1e-5, cos
    print("first 5 dims of first vector:", emb[0][:5].tolist())
    print("n_tokens: min %d max %d" % (min(n_tokens), max(n_tokens)))

    with open(os.path.join(out_dir, "minilm_sentences.json"), "w", encoding="utf-8") as f:
        json.dump(SENTENCES, f, ensure_ascii=False, indent=1)
        f.write("\n")

    ref = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "library_versions": {
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
        "pipeline": pipeline,
        "pooling": "mean",
        "max_seq_length": model.max_seq_length,
        "normalized": normalized,
        "dim": int(emb.shape[1]),
        "float_format": "float32 rounded to 7 significant digits",
        "n_tokens": n_tokens,
        "pre_normalize_norms": [round_sig(v) for v in raw_norms],
        "embeddings": [[round_sig(v) for v in row] for row in emb],
    }
    ref_path = os.path.join(out_dir, "minilm_st_reference.json")
    with open(ref_path, "w", encoding="utf-8") as f:
        json.dump(ref, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    size = os.path.getsize(ref_path)
    print("wrote %s (%d bytes)" % (ref_path, size))
    assert size < 400 * 1024, size


if __name__ == "__main__":
    main()
