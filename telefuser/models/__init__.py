"""Model definitions: one package per model (config, modules, parallel plan, checkpoint loading).

Nothing is imported here on purpose, so that importing one model does not load the others. Import the model's
package directly, e.g. ``from telefuser.models.minimax_h3 import MiniMaxH3DiT``.
"""
