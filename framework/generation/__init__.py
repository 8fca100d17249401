"""Text from a trained language model: sampling settings and the decoding loop (`framework generate`)."""
