"""Options registered from code, with extra default arguments (entry point framework.plugins).
`strategy=hooked_ddp_one_mb_buckets` is `hooked_ddp` with 1 MB gradient buckets."""
from framework.registry import register

register("strategy", "hooked_ddp_one_mb_buckets", "framework_plugin_example.strategy.HookedDDPStrategy",
         description="hooked_ddp with 1 MB gradient buckets (registered from code)", source="framework-plugin-example",
         bucket_cap_mb=1.0)
