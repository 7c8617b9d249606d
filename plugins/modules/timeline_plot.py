#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: timeline_plot
short_description: Draw a PNG timeline of an elastic training run from its events
version_added: "0.1.0"
description:
  - Draws the run recorded in the job's C(events.jsonl) as a PNG image of three
    panels against time (minutes since the first event) - world size, samples/s
    and validation accuracy per epoch - with resizes shaded and labelled
    (C(from→to) workers), lost workers and spot drains marked.
  - Takes the records, for example from M(dynatrain.elastic.job_info) with
    O(dynatrain.elastic.job_info#module:events=true) run on the master, or the path
    of an C(events.jsonl) on the host it runs on.
  - Fails with a clear message, and writes nothing, when there is no event to draw.
author:
  - dynatrain maintainers (@dynatrain)
options:
  events:
    description:
      - The records of C(events.jsonl) (JSON objects with at least C(event) and C(time)).
      - Mutually exclusive with O(src).
    type: list
    elements: dict
  src:
    description:
      - An C(events.jsonl) file on the host the module runs on.
      - Mutually exclusive with O(events).
    type: path
  dest:
    description:
      - The PNG file to write; its directory is created when missing.
    type: path
    required: true
  title:
    description:
      - The picture's title.
    type: str
    default: Training run timeline
attributes:
  check_mode:
    support: full
    details:
      - In check mode the events are checked but no file is written.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
requirements:
  - matplotlib (on the host the module runs on, usually the controller)
notes:
  - Run it on the controller (C(localhost)), whose Python has matplotlib (the
    collection's C(requirements.txt)); the nodes do not need it.
  - The same picture comes from the command line
    C(python -m ansible_collections.dynatrain.elastic.plugins.module_utils.timeline_plot EVENTS_JSONL OUT_PNG).
seealso:
  - module: dynatrain.elastic.job_info
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Read the job's events on the master
  dynatrain.elastic.job_info:
    path: /myEFSvolume
    events: true
  delegate_to: "{{ groups['dt_this_master'][0] }}"
  register: job

- name: Draw the timeline on the controller
  dynatrain.elastic.timeline_plot:
    events: "{{ job.events }}"
    dest: "{{ playbook_dir }}/timeline.png"
    title: "Cluster dtdemo"
  delegate_to: localhost
  register: plot

- name: Draw one from a copy of events.jsonl
  dynatrain.elastic.timeline_plot:
    src: /tmp/events.jsonl
    dest: /tmp/timeline.png
"""

RETURN = r"""
dest:
  description: The absolute path of the PNG written.
  returned: always
  type: str
  sample: /home/me/.dynatrain/dtdemo/timeline.png
summary:
  description: What the picture shows (markers drawn, by kind) and its size.
  returned: success
  type: dict
  contains:
    epochs:
      description: Epochs drawn (points of the samples/s and accuracy panels).
      type: int
    resizes:
      description: Resizes shaded (every change of the running group, whatever its cause).
      type: int
    failures:
      description: Lost workers marked.
      type: int
    spot_drains:
      description: Spot drains marked.
      type: int
    drains:
      description: Other drain requests marked.
      type: int
    world_max:
      description: The largest world size.
      type: int
    duration_s:
      description: Seconds from the first event to the last.
      type: float
    final_val_acc:
      description: The last validation accuracy, or null.
      type: float
    width_px:
      description: Width of the image.
      type: int
    height_px:
      description: Height of the image.
      type: int
  sample: {"epochs": 8, "resizes": 4, "failures": 1, "spot_drains": 1, "drains": 0, "world_max": 5,
           "duration_s": 260.8, "final_val_acc": 0.969, "width_px": 1200, "height_px": 800}
bad_lines:
  description: Line numbers of O(src) that were not a JSON record and were left out.
  returned: when O(src) is given
  type: list
  elements: int
  sample: []
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dynatrain.elastic.plugins.module_utils.job_events import (
    JobEventsError,
    timeline,
)
from ansible_collections.dynatrain.elastic.plugins.module_utils.shared_volume import read_events
from ansible_collections.dynatrain.elastic.plugins.module_utils.timeline_plot import (
    TimelinePlotError,
    render,
)


def run(params: dict, check_mode: bool = False) -> dict:
    """The module's logic without AnsibleModule; raises TimelinePlotError with the reason."""
    result = {"changed": False, "dest": os.path.abspath(params["dest"])}
    events = params["events"]
    if params["src"] is not None:
        if not os.path.exists(params["src"]):
            raise TimelinePlotError(f"{params['src']} does not exist: no timeline to draw (has the job started?)")
        events, result["bad_lines"] = read_events(params["src"])
    if not events:
        where = params["src"] or "events.jsonl (missing or empty)"
        raise TimelinePlotError(f"{where} holds no event: no timeline to draw (has the job started?)")
    if check_mode:
        try:
            timeline(events)
        except JobEventsError as exc:
            raise TimelinePlotError(str(exc)) from None
        return result
    summary = render(events, params["dest"], title=params["title"])
    summary.pop("axes", None)
    summary.pop("path", None)
    result.update(changed=True, summary=summary)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            events=dict(type="list", elements="dict"),
            src=dict(type="path"),
            dest=dict(type="path", required=True),
            title=dict(type="str", default="Training run timeline"),
        ),
        mutually_exclusive=[("events", "src")],
        required_one_of=[("events", "src")],
        supports_check_mode=True,
    )
    try:
        result = run(module.params, check_mode=module.check_mode)
    except TimelinePlotError as exc:
        module.fail_json(msg=str(exc), dest=os.path.abspath(module.params["dest"]))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
