"""A bare Channels consumer under daphne, for comparison with llmgw's agent consumer.

It does the least a heartbeat consumer can: parse the JSON, check the seq,
and answer a repeated seq with an error, as llmgw does. Run by heartbeats.py
as `daphne benchmarks.bare_consumer:application`.
"""

import json

import django
from django.conf import settings

settings.configure(INSTALLED_APPS=["channels"], CHANNEL_LAYERS={})
django.setup()

from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402


class BareConsumer(AsyncWebsocketConsumer):
    channel_layer_alias = None
    last = -1

    async def receive(self, text_data=None, bytes_data=None):
        msg = json.loads(text_data)
        if msg["type"] == "register":
            await self.send(text_data=json.dumps({"type": "registered", "node_id": msg["node_id"]}))
        elif msg["seq"] <= self.last:
            await self.send(text_data=json.dumps({"type": "error", "detail": "out of order"}))
        else:
            self.last = msg["seq"]


application = BareConsumer.as_asgi()
