"""The TensorBoard profiler plugin's step-time breakdown of a Kineto trace (torch-tb-profiler's own parser)."""
import json, sys
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.event_parser import ProfileRole
with open(sys.argv[1]) as f:
    doc = json.load(f)
p = RunProfileData.from_json("worker0", 0, doc)
p.process()
p.analyze()
c = p.avg_costs.costs
out = {r.name: c[r] for r in ProfileRole}
out["dataloader_ratio_pct"] = 100 * c[ProfileRole.DataLoader] / c[ProfileRole.Total]
out["steps"] = len(p.steps_costs) if hasattr(p, "steps_costs") else None
out["recommendations"] = p.recommendations
print(json.dumps(out, indent=1))
