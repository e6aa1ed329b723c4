# frozen_string_literal: true
#
# Echo bolt on our Ruby library (benchmark component): emit the input's values
# anchored to it, then ack it. Accepts the `batch` extension when offered.

require_relative '../../examples/ruby/multilang'

class EchoBolt < Multilang::Bolt
  def process(tup)
    emit(tup.values, anchors: [tup])
    ack(tup)
  end
end

EchoBolt.run
