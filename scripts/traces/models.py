"""The models of scripts/traces/generate.py: name -> (source, build). `build()` makes the model
and its inputs (not profiled), warms it up where a first call would initialise something, and
returns the run to profile. Configurations are the public ones named (hidden sizes, heads,
vocabularies); where a model is cut to fewer layers, to run in seconds on two cores, the source
says so (every layer of these models allocates as the others do)."""
import torch
import torch.nn.functional as F


def no_grad(fn):
    def run():
        with torch.no_grad():
            fn()
    return run


def forward(model, *args, **kwargs):
    model.eval()
    run = no_grad(lambda: model(*args, **kwargs))
    run()  # warm-up
    return run


def tokens(batch, seq, vocab):
    return torch.randint(0, vocab, (batch, seq))


def bert(layers=12, hidden=768, heads=12, inter=3072):
    from transformers import BertConfig, BertModel
    return BertModel(BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                intermediate_size=inter, attn_implementation="eager"))


def encoder(batch, seq, **kw):
    def build():
        m = bert(**kw)
        return forward(m, tokens(batch, seq, 30522), attention_mask=torch.ones(batch, seq, dtype=torch.long))
    return build


def serving():
    """DistilBERT answering requests of varying batch and length, one after another."""
    from transformers import DistilBertConfig, DistilBertModel
    m = DistilBertModel(DistilBertConfig(attn_implementation="eager")).eval()
    shapes = [(1, 32), (8, 128), (2, 384), (16, 64), (4, 256), (1, 512), (12, 96)]
    inputs = [tokens(b, s, 30522) for b, s in shapes]

    @no_grad
    def run():
        for x in inputs:
            m(x)
    run()
    return run


def gpt2(layers=12):
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(n_layer=layers, attn_implementation="eager"))


def llama(layers, dtype=torch.float32, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM
    # TinyLlama-1.1B's shape: hidden 2048, MLP 5632, 32 heads over 4 key/value heads.
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_key_value_heads=4,
                      num_hidden_layers=layers, vocab_size=32000, max_position_embeddings=2048,
                      attn_implementation="eager", **kw)
    return LlamaForCausalLM(cfg).to(dtype)


def prefill(make, batch, seq, vocab):
    def build():
        m = make()
        return forward(m, tokens(batch, seq, vocab), use_cache=True)
    return build


def decode(make, batch, prompt, new, vocab):
    """Greedy generation: a prefill, then one token at a time over a KV cache that grows."""
    def build():
        m = make().eval()
        x = tokens(batch, prompt, vocab)
        run = no_grad(lambda: m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                                         min_new_tokens=new, do_sample=False, pad_token_id=0))
        run()
        return run
    return build


def autocast_prefill():
    m = llama(4).eval()
    x = tokens(1, 384, 32000)

    def run():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            m(x, use_cache=True)
    run()
    return run


def t5_generate():
    from transformers import T5Config, T5ForConditionalGeneration
    # t5-small: d_model 512, 6+6 layers, 8 heads.
    m = T5ForConditionalGeneration(T5Config(decoder_start_token_id=0, attn_implementation="eager")).eval()
    x = tokens(4, 128, 32128)
    run = no_grad(lambda: m.generate(x, max_new_tokens=32, min_new_tokens=32, do_sample=False))
    run()
    return run


def whisper_encoder():
    from transformers import WhisperConfig, WhisperModel
    # whisper-base: d_model 512, 6 encoder layers, 8 heads, 80 mel bins over 30 s.
    cfg = WhisperConfig(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                        decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                        attn_implementation="eager")
    m = WhisperModel(cfg).get_encoder()
    return forward(m, torch.randn(2, 80, 3000))


def moe_prefill():
    from transformers import MixtralConfig, MixtralForCausalLM
    # Mixtral's routing (8 experts, 2 per token) at a small width: each expert's batch is the
    # tokens routed to it, so allocation sizes follow the data.
    cfg = MixtralConfig(hidden_size=1024, intermediate_size=3584, num_attention_heads=16, num_key_value_heads=4,
                        num_hidden_layers=4, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                        attn_implementation="eager")
    m = MixtralForCausalLM(cfg)
    return forward(m, tokens(2, 256, 32000), use_cache=True)


def vision(name, batch, size=224):
    def build():
        import torchvision
        m = getattr(torchvision.models, name)()
        return forward(m, torch.randn(batch, 3, size, size))
    return build


def train(make, inputs, loss, steps, opt="adamw"):
    """`steps` training steps (the first makes the optimizer's state): forward, backward, step."""
    def build():
        m = make()
        m.train()
        params = [p for p in m.parameters() if p.requires_grad]
        o = torch.optim.AdamW(params, lr=1e-4) if opt == "adamw" else torch.optim.SGD(params, lr=1e-3, momentum=0.9)
        batches = inputs()

        def run():
            for b in batches[:steps]:
                o.zero_grad(set_to_none=True)
                loss(m, b).backward()
                o.step()
        # Warm-up: one forward without grad initialises the kernels, and changes no state.
        with torch.no_grad():
            loss(m, batches[0])
        return run
    return build


def vision_batches(batch, classes=1000, size=224, n=2):
    return lambda: [(torch.randn(batch, 3, size, size), torch.randint(0, classes, (batch,))) for _ in range(n)]


def cls_loss(m, b):
    return F.cross_entropy(m(b[0]), b[1])


def bert_cls():
    from transformers import BertConfig, BertForSequenceClassification
    return BertForSequenceClassification(BertConfig(num_labels=2, attn_implementation="eager"))


def bert_loss(m, b):
    return m(input_ids=b[0], labels=b[1]).loss


def lm_loss(m, x):
    return m(input_ids=x, labels=x).loss


class LstmLm(torch.nn.Module):
    """A word-level LSTM language model (Zaremba et al.'s large: 2 layers of 1500; 10,000 words)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10000, 1500)
        self.lstm = torch.nn.LSTM(1500, 1500, num_layers=2, batch_first=True)
        self.out = torch.nn.Linear(1500, 10000)

    def forward(self, x):
        h, _ = self.lstm(self.emb(x))
        return self.out(h)


def lstm_loss(m, x):
    y = m(x[:, :-1])
    return F.cross_entropy(y.reshape(-1, y.shape[-1]), x[:, 1:].reshape(-1))


def unet_step():
    from diffusers import UNet2DConditionModel
    # Stable Diffusion 1.5's UNet (its diffusers config), one denoising step with
    # classifier-free guidance (batch 2) on a 32x32 latent (256x256 pixels).
    m = UNet2DConditionModel(sample_size=32, cross_attention_dim=768, attention_head_dim=8,
                             block_out_channels=(320, 640, 1280, 1280), layers_per_block=2)
    return forward(m, torch.randn(2, 4, 32, 32), torch.tensor([500, 500]), torch.randn(2, 77, 768))


def vae_decode():
    from diffusers import AutoencoderKL
    # Stable Diffusion's VAE (its diffusers config), decoding a 16x16 latent to 128x128 pixels.
    m = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4,
                      down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                      block_out_channels=(128, 256, 512, 512), layers_per_block=2, sample_size=256)
    return forward(m.decoder, torch.randn(1, 4, 16, 16))


MODELS = {
    "bert_base_s128_b8": ("BERT-base (BertConfig defaults: 12 layers, 768 wide), forward, batch 8 x 128 tokens",
                          encoder(8, 128)),
    "bert_base_s512_b2": ("BERT-base, forward, batch 2 x 512 tokens", encoder(2, 512)),
    "bert_large_s384_b1": ("BERT-large (24 layers, 1024 wide, 16 heads), forward, 1 x 384 tokens",
                           encoder(1, 384, layers=24, hidden=1024, heads=16, inter=4096)),
    "distilbert_serving": ("DistilBERT (DistilBertConfig defaults), forward on 7 requests of varying batch and "
                           "length (1x32 to 16x64, 1x512)", serving),
    "gpt2_prefill_s512": ("GPT-2 small (GPT2Config defaults) with its LM head, prefill of 1 x 512 tokens",
                          prefill(gpt2, 1, 512, 50257)),
    "gpt2_decode_b4": ("GPT-2 small, greedy generation: batch 4, 32-token prompt, 64 new tokens over a growing "
                       "KV cache", decode(gpt2, 4, 32, 64, 50257)),
    "llama_prefill_bf16": ("TinyLlama-1.1B's shape (2048 wide, grouped-query attention), first 4 of 22 layers, "
                           "bfloat16 weights, prefill of 1 x 512 tokens",
                           prefill(lambda: llama(4, torch.bfloat16), 1, 512, 32000)),
    "llama_decode_b2": ("TinyLlama-1.1B's shape, first 2 layers, greedy generation: batch 2, 64-token prompt, "
                        "128 new tokens", decode(lambda: llama(2), 2, 64, 128, 32000)),
    "llama_autocast": ("TinyLlama-1.1B's shape, first 4 layers, fp32 weights under bfloat16 autocast (mixed "
                       "precision), prefill of 1 x 384 tokens", autocast_prefill),
    "mixtral_moe_prefill": ("Mixtral's routing (8 experts, top 2) at 1024 wide, 4 layers, prefill of 2 x 256 "
                            "tokens", moe_prefill),
    "t5_small_generate": ("T5-small (T5Config defaults), encoder over 4 x 128 tokens, then 32 tokens decoded",
                          t5_generate),
    "whisper_base_encoder": ("Whisper-base's encoder (512 wide, 6 layers), 2 x 30 s of 80 mel bins",
                             whisper_encoder),
    "vit_b16_b8": ("ViT-B/16 (torchvision vit_b_16), forward, batch 8 at 224x224", vision("vit_b_16", 8)),
    "resnet50_b16": ("ResNet-50 (torchvision), forward, batch 16 at 224x224", vision("resnet50", 16)),
    "mobilenet_v3_b32": ("MobileNetV3-Large (torchvision), forward, batch 32 at 224x224",
                         vision("mobilenet_v3_large", 32)),
    "convnext_tiny_b8": ("ConvNeXt-T (torchvision), forward, batch 8 at 224x224", vision("convnext_tiny", 8)),
    "swin_t_b8": ("Swin-T (torchvision), forward, batch 8 at 224x224", vision("swin_t", 8)),
    "unet_sd15_step": ("Stable Diffusion 1.5's UNet (diffusers), one step with guidance: batch 2, 32x32 latent",
                       unet_step),
    "vae_sd_decode": ("Stable Diffusion's VAE decoder (diffusers), a 16x16 latent to 128x128", vae_decode),
    "resnet50_train_sgd": ("ResNet-50 (torchvision), 2 training steps, batch 8, SGD with momentum",
                           train(lambda: __import__("torchvision").models.resnet50(), vision_batches(8), cls_loss, 2,
                                 opt="sgd")),
    "efficientnet_b0_train": ("EfficientNet-B0 (torchvision), 2 training steps, batch 16, AdamW",
                              train(lambda: __import__("torchvision").models.efficientnet_b0(), vision_batches(16),
                                    cls_loss, 2)),
    "bert_base_train": ("BERT-base with a classification head, 2 training steps, batch 8 x 128 tokens, AdamW",
                        train(bert_cls, lambda: [(tokens(8, 128, 30522), torch.randint(0, 2, (8,)))] * 2,
                              bert_loss, 2)),
    "gpt2_train_varlen": ("GPT-2 small with its LM head, 3 training steps of batch 2 at 128, 256 and 64 tokens, "
                          "AdamW", train(gpt2, lambda: [tokens(2, s, 50257) for s in (128, 256, 64)], lm_loss, 3)),
    "lstm_lm_train": ("A 2-layer LSTM language model (1500 wide, 10,000 words), 2 training steps, batch 16 x 64 "
                      "tokens, AdamW", train(LstmLm, lambda: [tokens(16, 65, 10000)] * 2, lstm_loss, 2)),
}
