"""What TensorBoard itself shows for a log directory: its EventAccumulator (from the PyPI tensorboard package)
reads every event file of the directory, as the TensorBoard UI does, and this prints one JSON object
{tag: [[step, value], ...]} in the order it keeps them. Usage: tb_scalars.py LOGDIR"""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}))
